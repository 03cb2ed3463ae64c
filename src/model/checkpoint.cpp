// Model directories (docs/FORMAT.md): config.json and model.safetensors. Loading checks every
// tensor against the config: a missing tensor, an extra tensor or a disagreeing shape is an
// error naming the tensor and the file.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>

#include "diffattn/base/json_util.h"
#include "diffattn/base/files.h"
#include "diffattn/model/checkpoint.h"
#include "diffattn/model/config.h"
#include "diffattn/model/model.h"
#include "diffattn/model/safetensors.h"
#include "model/arch.h"
#include "model/dir_commit.h"

namespace diffattn::model {

namespace {

const char* const kTokenizerFiles[] = {"tokenizer.json", "tokenizer_config.json", "tokenizer.model",
                                       "special_tokens_map.json", "added_tokens.json", "vocab.json",
                                       "merges.txt", "chat_template.jinja", "chat_template.json"};

// PREFIX-NNNNN-of-NNNNN.SUFFIX, transformers' shard names.
bool is_shard_name(const std::string& n, const std::string& prefix, const std::string& suffix) {
  if (n.size() != prefix.size() + 15 + suffix.size() || n.rfind(prefix, 0) != 0 ||
      n.compare(n.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return false;
  }
  const std::string mid = n.substr(prefix.size(), 15);  // -NNNNN-of-NNNNN
  for (size_t i : {1u, 2u, 3u, 4u, 5u, 10u, 11u, 12u, 13u, 14u}) {
    if (mid[i] < '0' || mid[i] > '9') return false;
  }
  return mid[0] == '-' && mid.compare(6, 4, "-of-") == 0;
}

// The shard names an index file in dir lists (none when it is absent or unreadable).
std::set<std::string> indexed_shards(const std::string& dir) {
  std::set<std::string> out;
  for (const char* index : {"model.safetensors.index.json", "pytorch_model.bin.index.json"}) {
    try {
      for (const auto& [tensor, file] : parse_hf_weight_map(read_file(dir + "/" + index, kMaxJsonFileBytes), index)) {
        out.insert(file);
      }
    } catch (const Error&) {
    }
  }
  return out;
}

}  // namespace

std::string commit_model_dir(DirectoryUpdate& u, const std::string& dir, const ModelFiles& files) {
  for (const auto& [name, bytes] : files.extra) u.write(name, bytes);
  const std::set<std::string> shards = indexed_shards(dir);
  return u.commit([&](const std::string& n) { return is_model_file(n, shards, files.replace_tokenizer); });
}

bool is_model_file(const std::string& name, const std::set<std::string>& indexed, bool tokenizer) {
  static const char* const kModel[] = {"config.json", "generation_config.json", "model.safetensors",
                                       "model.safetensors.index.json", "pytorch_model.bin",
                                       "pytorch_model.bin.index.json", "tf_model.h5", "flax_model.msgpack"};
  // write_file_atomic's temporary files (NAME.tmp.PID.N) of a write cut short count as NAME.
  std::string n = name;
  if (const size_t t = n.rfind(".tmp."); t != std::string::npos) {
    const std::string rest = n.substr(t + 5);  // PID.N
    const size_t dot = rest.find('.');
    auto digits = [](const std::string& x) {
      return !x.empty() && std::all_of(x.begin(), x.end(), [](char c) { return c >= '0' && c <= '9'; });
    };
    if (dot != std::string::npos && digits(rest.substr(0, dot)) && digits(rest.substr(dot + 1))) n = n.substr(0, t);
  }
  for (const char* m : kModel) {
    if (n == m) return true;
  }
  if (indexed.count(n) || is_shard_name(n, "model", ".safetensors") || is_shard_name(n, "pytorch_model", ".bin")) {
    return true;
  }
  if (tokenizer) {
    for (const char* t : kTokenizerFiles) {
      if (n == t) return true;
    }
  }
  return false;
}

ModelFiles model_side_files(const std::string& dir) {
  ModelFiles f;
  f.replace_tokenizer = true;  // the copy has the source's tokenizer, or none
  struct stat st {};
  for (const char* t : kTokenizerFiles) {
    const std::string p = dir + "/" + t;
    if (::stat(p.c_str(), &st) == 0) f.extra[t] = read_file(p);
  }
  const std::string g = dir + "/generation_config.json";
  if (::stat(g.c_str(), &st) == 0) f.extra["generation_config.json"] = read_file(g, kMaxJsonFileBytes);
  return f;
}

std::string save_model(const Model& m, const std::string& dir, DType dtype, const ModelFiles& files) {
  if (m.config().recurrent()) {
    throw InvalidArgument("saving a phi4flash (SambaY) model is not supported: it is read from "
                          "its Hugging Face directory as published, and run there");
  }
  DirectoryUpdate u(dir);
  std::vector<SafeTensorRef> refs;
  std::vector<std::vector<float>> converted;  // a model over kept weights: float32 copies
  converted.reserve(m.tensors().size());
  for (const TensorInfo& t : m.tensors()) {
    const float* data = nullptr;
    if (m.trainable()) {
      data = m.params().data() + t.offset;
    } else {
      converted.push_back(m.weight_f32(t.name));
      data = converted.back().data();
    }
    refs.push_back({t.name, t.shape, data});
  }
  write_safetensors(u.path("model.safetensors"), refs, {{"format", "diffattn/1"}}, dtype);
  u.write("config.json", m.config().to_json());
  return commit_model_dir(u, dir, files);
}

namespace {

// The checks shared by check_weights_header and load_weights: every tensor of the table present
// with its shape, and (unless allow_extra) nothing else under prefix. Names is a map from a name
// to something with a `shape`.
template <class Names>
void check_names_and_shapes(const ModelConfig& cfg, const std::vector<TensorInfo>& table,
                            const Names& file, const std::string& where, const std::string& prefix,
                            bool allow_extra) {
  for (const TensorInfo& t : table) {
    auto it = file.find(prefix + t.name);
    if (it == file.end()) {
      throw IoError(where + ": missing tensor \"" + prefix + t.name + "\" of shape " +
                    shape_str(t.shape) + " (the config asks for it)");
    }
    if (it->second.shape != t.shape) {
      throw IoError(where + ": tensor \"" + prefix + t.name + "\" has shape " +
                    shape_str(it->second.shape) + ", the config implies " + shape_str(t.shape));
    }
  }
  if (allow_extra) return;
  std::set<std::string> known;
  for (const TensorInfo& t : table) known.insert(prefix + t.name);
  for (const auto& [name, t] : file) {
    if (name.rfind(prefix, 0) != 0 || known.count(name)) continue;
    throw IoError(where + ": extra tensor " + quote_name(name) + " of shape " + shape_str(t.shape) +
                  " is not part of a " + nn::attn_kind_name(cfg.attention) +
                  " model with this config" +
                  (cfg.tie_embeddings && name == prefix + "lm_head.weight" ? " (tie_embeddings is true)"
                                                                            : ""));
  }
}

}  // namespace

void check_weights_header(const ModelConfig& cfg, const SafeTensorsHeader& h, const std::string& where,
                          const std::string& prefix, bool allow_extra) {
  check_names_and_shapes(cfg, tensor_table(cfg), h.tensors, where, prefix, allow_extra);
}

namespace {

// A NaN or Inf weight would only show later, as a NaN loss or a kernel's complaint naming
// neither the file nor the tensor.
void check_finite(const float* p, int64_t n, const std::string& where, const std::string& name,
                  const Shape& shape) {
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(p[i])) {
      throw IoError(where + ": tensor \"" + name + "\" holds " + (std::isnan(p[i]) ? "NaN" : "Inf") +
                    " at flat index " + std::to_string(i) + " of its " + std::to_string(n) +
                    " values (shape " + shape_str(shape) + ")");
    }
  }
}

}  // namespace

std::shared_ptr<OwnedWeights> load_weights(const ModelConfig& cfg, const SafeTensorsFile& f,
                                           const std::string& where, const std::string& prefix,
                                           bool allow_extra) {
  const std::vector<TensorInfo> table = tensor_table(cfg);
  check_names_and_shapes(cfg, table, f.tensors, where, prefix, allow_extra);
  // Every value is written below: the table's tensors tile the buffer.
  auto w = std::make_shared<OwnedWeights>(table, OwnedWeights::Fill::None);
  for (const TensorInfo& t : table) {
    const std::vector<float>& src = f.tensors.at(prefix + t.name).data;
    check_finite(src.data(), t.numel, where, prefix + t.name, t.shape);
    std::copy(src.begin(), src.end(), w->values().begin() + t.offset);
  }
  return w;
}

std::shared_ptr<OwnedWeights> read_f32_weights(const std::string& path, const SafeTensorsHeader& h,
                                               const ModelConfig& cfg) {
  const std::vector<TensorInfo> table = tensor_table(cfg);
  auto w = std::make_shared<OwnedWeights>(table, OwnedWeights::Fill::None);
  const MappedFile f(path);
  if (f.size() != h.file_size) throw IoError(path + ": the file changed while it was read");
  for (const TensorInfo& t : table) {
    const SafeTensorEntry& e = h.tensors.at(t.name);
    float* dst = w->values().data() + t.offset;
    std::memcpy(dst, f.data() + h.data_offset + e.begin, sizeof(float) * static_cast<size_t>(t.numel));
    f.drop(h.data_offset + e.begin, h.data_offset + e.end);  // the copy is what stays
    check_finite(dst, t.numel, path, t.name, t.shape);
  }
  return w;
}

void check_model_dir(const std::string& dir) {
  const char* const expected = "a model directory holds config.json and model.safetensors";
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    throw IoError(dir + ": not a model directory (no such directory; " + expected + ")");
  }
  if (!S_ISDIR(st.st_mode)) throw IoError(dir + ": not a model directory (not a directory; " + expected + ")");
  if (::stat((dir + "/config.json").c_str(), &st) != 0) {
    throw IoError(dir + ": not a model directory (no config.json; " + expected + ")");
  }
}

}  // namespace diffattn::model
