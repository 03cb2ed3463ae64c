// Hugging Face checkpoint directories (docs/FORMAT.md, "Hugging Face directories"):
// LlamaForCausalLM ("llama"), DiffLlamaForCausalLM ("diffllama") and Motif-2's MotifForCausalLM
// ("Motif", docs/models/motif2.md), read as the project's standard and diff_v1 models. Each layout is mapped onto the one operator at load time by
// permuting projection rows once:
//  - RoPE: transformers rotates halves (feature j with j + d/2); the project rotates adjacent
//    pairs (2j, 2j + 1). Query and key rows are reordered inside every head so HF feature j
//    lands at 2j and j + d/2 at 2j + 1; q.k is unchanged and both rotate by the same angles.
//  - DiffLlama heads: differential head i uses query heads i and i + H/2 and key/value heads
//    g = i / n_rep and g + Hkv/2 ("halves"); the project's pair i reads query sub-heads 2i, 2i+1,
//    key sub-heads 2g, 2g+1 and a 2d value [v_g | v_(g + Hkv/2)] ("adjacent pairs").
//  - Motif heads: G groups of S query heads, S - 1 signal heads then one noise head; key/value
//    heads in adjacent pairs (2j signal, 2j + 1 noise, value [v_2j | v_2j+1]). Signal head i (in
//    query order) becomes the project's pair i with its group's noise head as second sub-head
//    (a copy per pair when S > 2: config noise_share = S - 1); keys and values are already the
//    project's adjacent pairs.
// The matrices that need no permutation (embeddings, o_proj, the MLP, lm_head) are used where
// they lie in the memory-mapped files, in their stored type; the permuted q|k|v block of each
// layer is one copy in the stored type; the small vectors (norms, lambdas, biases) are float32.
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "diffattn/base/json_util.h"
#include "diffattn/base/files.h"
#include "diffattn/base/memory.h"
#include "diffattn/model/checkpoint.h"
#include "diffattn/model/config.h"
#include "diffattn/model/model.h"
#include "diffattn/model/safetensors.h"
#include "model/config_json.h"
#include "model/arch.h"
#include "model/dir_commit.h"

namespace diffattn {

using json = nlohmann::json;

namespace {

bool file_exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
}


// Phi-4-mini-flash's config.json (docs/models/phi4flash.md, "config.json"): the keys whose class
// defaults differ from the published values are required; the mamba_* keys take the class's
// defaults; what the published modeling file would read differently is refused.
ModelConfig parse_phi4flash_config(const json& j, const std::string& where,
                                   const std::function<int64_t(const char*)>& integer,
                                   const std::function<bool(const char*)>& has,
                                   const std::function<double(const char*, double)>& number_or,
                                   const std::function<bool(const char*, bool)>& boolean_or) {
  auto int_or = [&](const char* key, int64_t dflt) { return has(key) ? integer(key) : dflt; };
  auto refuse = [&](const char* key, const std::string& why) {
    throw InvalidArgument(where + ": " + key + " " + json_brief(j.at(key)) + " is not supported (" + why + ")");
  };
  if (has("hidden_act") && j.at("hidden_act") != "silu") refuse("hidden_act", "the MLP is SwiGLU: \"silu\"");
  if (int_or("mb_per_layer", 2) != 2) refuse("mb_per_layer", "the published code's layer pattern assumes 2");
  for (const char* key : {"mlp_bias", "lm_head_bias", "mamba_proj_bias"}) {
    if (boolean_or(key, false)) refuse(key, "the published code has no such bias");
  }
  if (!boolean_or("mamba_conv_bias", true)) refuse("mamba_conv_bias", "the published code always has the conv bias");
  if (!boolean_or("tie_word_embeddings", true)) refuse("tie_word_embeddings", "the published model ties its head to the embedding");
  const int64_t C = integer("hidden_size"), H = integer("num_attention_heads");
  const int64_t G = integer("num_key_value_heads");
  if (C % H != 0 || H % 2 != 0 || G % 2 != 0 || H % G != 0) {
    throw InvalidArgument(where + ": num_attention_heads = " + std::to_string(H) + " must divide hidden_size = " +
                          std::to_string(C) + ", and it and num_key_value_heads = " + std::to_string(G) +
                          " must be even, the latter dividing the former (heads pair up)");
  }
  if (has("sliding_window") && !j.at("sliding_window").is_number_integer()) {
    refuse("sliding_window", "one window size for the sliding-window layers, an integer");
  }
  ModelConfig c;
  c.arch = Arch::SambaY;
  c.attention = nn::AttnKind::DiffV1;
  c.vocab_size = integer("vocab_size");
  c.d_model = C;
  c.n_layers = integer("num_hidden_layers");
  c.ffn_dim = integer("intermediate_size");
  c.n_heads = H / 2;
  c.n_kv_heads = G / 2;
  c.head_dim = C / H;
  c.max_seq_len = int_or("max_position_embeddings", 4096);
  c.norm_eps = static_cast<float>(number_or("layer_norm_eps", 1e-5));
  c.subln_eps = 1e-5f;  // fixed in the modeling code
  c.tie_embeddings = true;
  c.attn_bias = true;
  c.sambay.d_state = int_or("mamba_d_state", 16);
  c.sambay.d_conv = int_or("mamba_d_conv", 4);
  c.sambay.expand = int_or("mamba_expand", 2);
  c.sambay.dt_rank = (C + 15) / 16;
  if (has("mamba_dt_rank") && !(j.at("mamba_dt_rank") == "auto" ||
                                (j.at("mamba_dt_rank").is_number_integer() &&
                                 j.at("mamba_dt_rank").get<int64_t>() == c.sambay.dt_rank))) {
    refuse("mamba_dt_rank", "the published code uses ceil(hidden_size / 16) = " + std::to_string(c.sambay.dt_rank));
  }
  c.sambay.window = integer("sliding_window");
  c.validate(where);  // the layer pattern's L % 4 == 0 among the rest
  return c;
}

}  // namespace

ModelConfig parse_hf_config(const json& j, const std::string& where, ArchLayout* layout) {
  auto need = [&](const char* key) -> const json& {
    if (!j.contains(key) || j.at(key).is_null()) {
      throw InvalidArgument(where + ": missing key \"" + key + "\"");
    }
    return j.at(key);
  };
  auto integer = [&](const char* key) {
    const json& v = need(key);
    if (!v.is_number_integer()) {
      throw InvalidArgument(where + ": \"" + key + "\" must be an integer, got " + json_brief(v));
    }
    const int64_t x = v.get<int64_t>();
    if (x < 1 || x > (int64_t{1} << 24)) {
      throw InvalidArgument(where + ": \"" + key + "\" must be between 1 and 2^24, got " +
                            std::to_string(x));
    }
    return x;
  };
  auto has = [&](const char* key) { return j.contains(key) && !j.at(key).is_null(); };
  auto number_or = [&](const char* key, double dflt) {
    if (!has(key)) return dflt;
    const json& v = j.at(key);
    if (!v.is_number()) {
      throw InvalidArgument(where + ": \"" + key + "\" must be a number, got " + json_brief(v));
    }
    return v.get<double>();
  };
  auto boolean_or = [&](const char* key, bool dflt) {
    if (!has(key)) return dflt;
    if (!j.at(key).is_boolean()) {
      throw InvalidArgument(where + ": \"" + key + "\" must be true or false, got " +
                            json_brief(j.at(key)));
    }
    return j.at(key).get<bool>();
  };

  const json& mt = need("model_type");
  if (mt == "phi4flash") {
    if (layout) layout->sambay = true;
    return parse_phi4flash_config(j, where, integer, has, number_or, boolean_or);
  }
  std::string type = mt.is_string() ? mt.get<std::string>() : "";
  std::transform(type.begin(), type.end(), type.begin(),
                 [](char ch) { return static_cast<char>(std::tolower(static_cast<unsigned char>(ch))); });
  if (type == "motif") {
    // Motif's own config spells it "Motif"; mlx ports lower-case it.
  } else if (type != "llama" && type != "diffllama") {
    throw InvalidArgument(where + ": model_type " + json_brief(mt) +
                          " is not supported (diffattn reads \"llama\", \"diffllama\", \"Motif\" and \"phi4flash\")");
  } else {
    type = mt.get<std::string>();  // Llama and DiffLlama: the exact lower-case spelling only
    if (type != "llama" && type != "diffllama") {
      throw InvalidArgument(where + ": model_type " + json_brief(mt) +
                            " is not supported (diffattn reads \"llama\", \"diffllama\", \"Motif\" and \"phi4flash\")");
    }
  }
  const bool motif = type == "motif";
  if (motif) {
    if (has("hidden_act") && j.at("hidden_act") != "poly_norm") {
      throw InvalidArgument(where + ": hidden_act " + json_brief(j.at("hidden_act")) +
                            " is not supported (Motif-2's MLP is PolyNorm: \"poly_norm\")");
    }
    for (const char* key : {"use_bias", "attention_bias", "qkv_bias", "mlp_bias"}) {
      if (boolean_or(key, false)) {
        throw InvalidArgument(where + ": " + key + " is true, but no Motif-2 model has biases "
                              "(diffattn reads Motif without them)");
      }
    }
    if (has("rope_scaling")) {
      throw InvalidArgument(where + ": rope_scaling " + json_brief(j.at("rope_scaling")) +
                            " is not supported for Motif (no published Motif-2 config sets one)");
    }
    if (has("k_ratio") && !(j.at("k_ratio").is_number_integer() && j.at("k_ratio").get<int64_t>() == 1)) {
      throw InvalidArgument(where + ": k_ratio " + json_brief(j.at("k_ratio")) +
                            " is not supported (Motif-2 pairs key heads: k_ratio 1)");
    }
    if (number_or("logit_scale", 1.0) != 1.0) {
      throw InvalidArgument(where + ": logit_scale " + json_brief(j.at("logit_scale")) +
                            " is not supported (Motif-2 does not scale its logits)");
    }
  } else if (has("hidden_act") && j.at("hidden_act") != "silu") {
    throw InvalidArgument(where + ": hidden_act " + json_brief(j.at("hidden_act")) +
                          " is not supported (the MLP is SwiGLU: \"silu\")");
  }
  if (number_or("partial_rotary_factor", 1.0) != 1.0) {
    throw InvalidArgument(where + ": partial_rotary_factor " +
                          json_brief(j.at("partial_rotary_factor")) +
                          " is not supported (RoPE rotates the whole head)");
  }
  if (has("pretraining_tp") && !(j.at("pretraining_tp").is_number_integer())) {
    throw InvalidArgument(where + ": \"pretraining_tp\" must be an integer");
  }
  ArchLayout L;
  L.diff = type == "diffllama" || motif;
  L.motif = motif;
  const int64_t C = integer("hidden_size");
  L.H = integer("num_attention_heads");
  L.Hkv = has("num_key_value_heads") ? integer("num_key_value_heads") : L.H;
  if (has("head_dim")) {
    L.d = integer("head_dim");
  } else {
    if (C % L.H != 0) {
      throw InvalidArgument(where + ": hidden_size = " + std::to_string(C) +
                            " is not a multiple of num_attention_heads = " + std::to_string(L.H) +
                            " (and no head_dim is given)");
    }
    L.d = C / L.H;
  }
  if (!motif && L.H % L.Hkv != 0) {  // Motif: key/value pairs per group, checked below
    throw InvalidArgument(where + ": num_key_value_heads = " + std::to_string(L.Hkv) +
                          " does not divide num_attention_heads = " + std::to_string(L.H));
  }
  if (motif) {
    // G noise heads, each closing a group of S = H / G query heads; P = Hkv / 2 key/value pairs,
    // group g reading pair g / (G / P) (docs/models/motif2.md, "Attention", steps 3-5).
    L.G = has("num_noise_heads") ? integer("num_noise_heads") : L.H / 2;
    const int64_t P = L.Hkv / 2;
    if (L.G < 1 || L.H % L.G != 0 || L.H / L.G < 2 || L.Hkv % 2 != 0 || P < 1 || L.G % P != 0) {
      throw InvalidArgument(where + ": Motif's grouped heads need num_noise_heads (G = " +
                            std::to_string(L.G) + ") to divide num_attention_heads (" +
                            std::to_string(L.H) + ") at least twice, an even num_key_value_heads (" +
                            std::to_string(L.Hkv) + ") and its pairs to divide G");
    }
    L.S = L.H / L.G;
  } else if (L.diff && (L.H % 2 != 0 || L.Hkv % 2 != 0)) {
    throw InvalidArgument(where + ": DiffLlama splits the heads in two halves, so " +
                          std::string(L.H % 2 ? "num_attention_heads = " + std::to_string(L.H)
                                              : "num_key_value_heads = " + std::to_string(L.Hkv)) +
                          " must be even");
  }

  ModelConfig c;
  c.attention = L.diff ? nn::AttnKind::DiffV1 : nn::AttnKind::Standard;
  c.vocab_size = integer("vocab_size");
  c.d_model = C;
  c.n_layers = integer("num_hidden_layers");
  c.ffn_dim = integer("intermediate_size");
  c.n_heads = motif ? L.H - L.G : L.diff ? L.H / 2 : L.H;
  c.n_kv_heads = L.diff ? L.Hkv / 2 : L.Hkv;
  c.head_dim = L.d;
  c.max_seq_len = has("max_position_embeddings") ? integer("max_position_embeddings")
                  : motif                         ? 8192
                                                  : 2048;
  c.norm_eps = static_cast<float>(number_or("rms_norm_eps", 1e-6));
  c.tie_embeddings = boolean_or("tie_word_embeddings", false);
  c.attn_bias = boolean_or("attention_bias", false);
  c.mlp_bias = boolean_or("mlp_bias", false);
  if (motif) {
    c.mlp = MlpKind::PolyNorm;
    c.lambda_init_shift = 1;
    c.subln_eps = static_cast<float>(number_or("attn_rms_norm_eps", 1e-5));
    c.noise_share = L.S - 1;
  }
  if (L.diff && c.mlp_bias) {
    throw InvalidArgument(where + ": mlp_bias is true, but DiffLlama's MLP has no biases");
  }
  // RoPE: transformers 5 writes rope_parameters {rope_type, rope_theta, ...}; 4.x writes
  // rope_theta and rope_scaling (null when unscaled).
  c.rope_theta = number_or("rope_theta", 10000.0);
  if (has("rope_parameters")) {
    const json& r = j.at("rope_parameters");
    if (!r.is_object()) {
      throw InvalidArgument(where + ": rope_parameters must be an object, got " + json_brief(r));
    }
    if (r.contains("rope_theta")) {
      if (!r.at("rope_theta").is_number()) {
        throw InvalidArgument(where + ": rope_parameters: \"rope_theta\" must be a number");
      }
      c.rope_theta = r.at("rope_theta").get<double>();
    }
    c.rope_scaling = parse_rope_scaling(r, where + ": rope_parameters");
  } else if (has("rope_scaling")) {
    c.rope_scaling = parse_rope_scaling(j.at("rope_scaling"), where + ": rope_scaling");
  }
  c.validate(where);
  if (layout) *layout = L;
  return c;
}

namespace {

// Row r of the project's layout takes row *_src(r) of the checkpoint's: q (H heads), k and v
// (Hkv heads), head size d.
struct Permutation {
  ArchLayout L;
  int64_t rope_row(int64_t p) const {  // inside one head: interleaved position <- half position
    return p % 2 == 0 ? p / 2 : p / 2 + L.d / 2;
  }
  // Motif: the query head of the project's sub-head oh (pair oh / 2: signal head i = oh / 2 of
  // group i / (S - 1), or that group's noise head).
  int64_t motif_head(int64_t oh) const {
    const int64_t i = oh / 2, g = i / (L.S - 1);
    return g * L.S + (oh % 2 == 0 ? i % (L.S - 1) : L.S - 1);
  }
  int64_t q_src(int64_t r) const {
    if (L.native) return r;
    const int64_t oh = r / L.d, p = r % L.d;
    const int64_t hh = L.motif ? motif_head(oh) : L.diff ? (oh / 2) + (oh % 2) * (L.H / 2) : oh;
    return hh * L.d + rope_row(p);
  }
  int64_t k_src(int64_t r) const {
    if (L.native) return r;
    const int64_t oh = r / L.d, p = r % L.d;
    const int64_t hh = L.diff && !L.motif ? (oh / 2) + (oh % 2) * (L.Hkv / 2) : oh;
    return hh * L.d + rope_row(p);
  }
  int64_t v_src(int64_t r) const {
    if (!L.diff || L.native || L.motif) return r;
    // group g of 2d rows: [v_g | v_(g + Hkv/2)]
    const int64_t g = r / (2 * L.d), p = r % (2 * L.d);
    const int64_t hh = g + (p / L.d) * (L.Hkv / 2);
    return hh * L.d + p % L.d;
  }
};

// One tensor of the checkpoint: its shard, header entry and where its bytes lie.
struct Located {
  const MappedFile* file = nullptr;
  const SafeTensorEntry* entry = nullptr;
  std::string name;
  const uint8_t* bytes() const { return file->data() + entry->begin; }
};

// The weights: mapped shards, converted copies, and the typed views into them.
struct HfStore : WeightStore {
  std::vector<std::unique_ptr<MappedFile>> files;
  std::vector<std::vector<uint8_t>> owned;  // permuted projections, realigned tensors
  std::vector<std::vector<float>> small;    // norms, lambdas, biases (float32)
};

// The checkpoint's tensors: from model.safetensors.index.json's weight_map when there is one
// (shards named there, each a plain file name inside dir), else model.safetensors.
class Shards {
 public:
  // The weight files open_model_dir resolved: the index's weight_map, or model.safetensors.
  Shards(const ModelDir& dir, HfStore& store) : dir_(dir.path), store_(store) {
    if (!dir.weight_index.empty()) {
      map_ = dir.weight_map;
      where_ = dir.weight_index;
    } else {
      open("model.safetensors");
      for (const auto& [name, e] : headers_.at("model.safetensors").tensors) {
        map_[name] = "model.safetensors";
      }
      where_ = dir.file("model.safetensors");
    }
    // Every shard the index names exists and holds what the index says it holds.
    for (const auto& [name, file] : map_) {
      const SafeTensorsHeader& h = open(file);
      if (!h.tensors.count(name)) {
        throw IoError(where_ + ": tensor " + quote_name(name) + " is mapped to " + file +
                      ", which does not hold it");
      }
    }
  }

  const std::string& where() const { return where_; }
  const std::map<std::string, std::string>& names() const { return map_; }

  // The tensor `name` with its shape checked; errors name the file.
  Located get(const std::string& name, const Shape& shape) {
    auto it = map_.find(name);
    if (it == map_.end()) {
      throw IoError(where_ + ": missing tensor " + quote_name(name) + " of shape " +
                    shape_str(shape) + " (config.json asks for it)");
    }
    const SafeTensorsHeader& h = headers_.at(it->second);
    const SafeTensorEntry& e = h.tensors.at(name);
    const std::string path = dir_ + "/" + it->second;
    if (e.shape != shape) {
      throw IoError(path + ": tensor " + quote_name(name) + " has shape " + shape_str(e.shape) +
                    ", config.json implies " + shape_str(shape));
    }
    Located t;
    t.file = mapped_.at(it->second);
    t.entry = &e;
    t.name = name;
    return t;
  }

 private:
  const SafeTensorsHeader& open(const std::string& file) {
    auto it = headers_.find(file);
    if (it != headers_.end()) return it->second;
    const std::string path = dir_ + "/" + file;
    SafeTensorsHeader h = read_safetensors_header(path);
    auto m = std::make_unique<MappedFile>(path);
    if (m->size() != h.file_size) throw IoError(path + ": the file changed while it was read");
    // The data start in the file: entries' begin/end are relative to it.
    for (auto& [n, e] : h.tensors) {
      e.begin += h.data_offset;
      e.end += h.data_offset;
    }
    mapped_[file] = m.get();
    store_.files.push_back(std::move(m));
    return headers_.emplace(file, std::move(h)).first->second;
  }

  std::string dir_, where_;
  HfStore& store_;
  std::map<std::string, std::string> map_;
  std::map<std::string, SafeTensorsHeader> headers_;
  std::map<std::string, const MappedFile*> mapped_;
};

// The first non-finite element of n values of type t, or -1.
int64_t first_non_finite(const uint8_t* p, DType t, int64_t n) {
  int64_t bad = -1;
  if (t == DType::F32) {
    const auto* f = reinterpret_cast<const uint32_t*>(p);
#pragma omp parallel for schedule(static) reduction(max : bad) if (n >= (1 << 20))
    for (int64_t i = 0; i < n; ++i) {
      if ((f[i] & 0x7f800000u) == 0x7f800000u && bad < 0) bad = i;
    }
  } else {
    const auto* h = reinterpret_cast<const uint16_t*>(p);
    const uint16_t mask = t == DType::BF16 ? 0x7f80 : 0x7c00;
#pragma omp parallel for schedule(static) reduction(max : bad) if (n >= (1 << 20))
    for (int64_t i = 0; i < n; ++i) {
      if ((h[i] & mask) == mask && bad < 0) bad = i;
    }
  }
  if (bad < 0) return -1;
  // The first one (threads may each have found a later one): rescan up to it.
  const size_t es = dtype_size(t);
  for (int64_t i = 0; i <= bad; ++i) {
    const uint8_t* q = p + static_cast<size_t>(i) * es;
    uint32_t u = 0;
    if (t == DType::F32) {
      std::memcpy(&u, q, 4);
      if ((u & 0x7f800000u) == 0x7f800000u) return i;
    } else {
      uint16_t h;
      std::memcpy(&h, q, 2);
      const uint16_t mask = t == DType::BF16 ? 0x7f80 : 0x7c00;
      if ((h & mask) == mask) return i;
    }
  }
  return bad;
}

void check_finite(const Located& t) {
  const int64_t i = first_non_finite(t.bytes(), t.entry->dtype, t.entry->numel);
  if (i >= 0) {
    throw IoError(t.file->path() + ": tensor " + quote_name(t.name) + " holds NaN or Inf at flat index " +
                  std::to_string(i) + " of its " + std::to_string(t.entry->numel) + " values (shape " +
                  shape_str(t.entry->shape) + ")");
  }
}

class Loader {
 public:
  explicit Loader(const ModelDir& dir)
      : dir_(dir.path), cfg_(dir.config), L_(*dir.layout), perm_{L_}, store_(std::make_shared<HfStore>()),
        shards_(dir, *store_) {}

  // The project's own layout (docs/FORMAT.md) with 16-bit tensors: each layer's q|k|v (and
  // V2's lambda_proj) stacked into one block, as the model runs them as one product (likewise
  // their biases); every other matrix where it lies in the mapped file, 1-D tensors as float32.
  // Names and shapes were checked against the config already.
  std::shared_ptr<HfStore> load_native() {
    const std::vector<TensorInfo> table = tensor_table(cfg_);
    std::map<std::string, size_t> idx;
    for (size_t i = 0; i < table.size(); ++i) idx[table[i].name] = i;
    store_->tensors.assign(table.size(), TypedPtr{});
    std::set<std::string> used;
    auto at = [&](const std::string& name) { return get(name, table[idx.at(name)].shape, used); };
    auto put = [&](const std::string& name, TypedPtr p) { store_->tensors[idx.at(name)] = p; };
    const bool v2 = cfg_.attention == nn::AttnKind::DiffV2;
    for (int64_t l = 0; l < cfg_.n_layers; ++l) {
      const std::string p = "layers." + std::to_string(l) + ".attn.";
      const Located q = at(p + "q_proj.weight"), k = at(p + "k_proj.weight"), v = at(p + "v_proj.weight");
      const int64_t nq = q.entry->shape[0], nk = k.entry->shape[0];
      Located lam;
      if (v2) lam = at(p + "lambda_proj.weight");
      const TypedPtr proj = permuted_qkv(q, k, v, cfg_.d_model, v2 ? &lam : nullptr);
      const size_t row = static_cast<size_t>(cfg_.d_model) * dtype_size(proj.dtype);
      const auto* base = static_cast<const uint8_t*>(proj.data);
      put(p + "q_proj.weight", proj);
      put(p + "k_proj.weight", {base + static_cast<size_t>(nq) * row, proj.dtype});
      put(p + "v_proj.weight", {base + static_cast<size_t>(nq + nk) * row, proj.dtype});
      if (v2) put(p + "lambda_proj.weight", {base + static_cast<size_t>(nq + 2 * nk) * row, proj.dtype});
      if (cfg_.attn_bias) {
        const float* b = permuted_qkv_bias(at(p + "q_proj.bias"), at(p + "k_proj.bias"), at(p + "v_proj.bias"));
        put(p + "q_proj.bias", typed(b));
        put(p + "k_proj.bias", typed(b + nq));
        put(p + "v_proj.bias", typed(b + nq + nk));
      }
    }
    for (const TensorInfo& t : table) {
      if (store_->tensors[idx.at(t.name)].data != nullptr) continue;  // stacked above
      put(t.name, t.shape.size() == 2 ? in_place(at(t.name)) : small(at(t.name)));
    }
    store_->description = "diffattn " + std::string(nn::attn_kind_name(cfg_.attention)) + ", " +
                          stored_types() + ", memory-mapped";
    return store_;
  }

  // Phi-4-mini-flash: every tensor under its published name (tensor_table's name after
  // "model."), matrices where they lie in the mapped files, the rest as float32.
  std::shared_ptr<HfStore> load_sambay() {
    const std::vector<TensorInfo> table = tensor_table(cfg_);
    store_->tensors.assign(table.size(), TypedPtr{});
    std::set<std::string> used;
    for (size_t i = 0; i < table.size(); ++i) {
      const Located t = get("model." + table[i].name, table[i].shape, used);
      // A_log is (E, N) but read as float32 like the vectors (A = -exp(A_log) at load).
      const bool matrix = table[i].shape.size() == 2 && table[i].name.find("A_log") == std::string::npos;
      store_->tensors[i] = matrix ? in_place(t) : small(t);
    }
    for (const auto& [name, file] : shards_.names()) {
      if (used.count(name) || name == "lm_head.weight") continue;  // tying replaces lm_head
      throw IoError(dir_ + "/" + file + ": extra tensor " + quote_name(name) +
                    " is not part of a Phi-4-mini-flash (phi4flash) model with this config.json");
    }
    store_->description = "Hugging Face phi4flash, " + stored_types() + ", " +
                          std::to_string(store_->files.size()) +
                          (store_->files.size() == 1 ? " file" : " files") + " memory-mapped";
    return store_;
  }

  std::shared_ptr<HfStore> load() {
    const std::vector<TensorInfo> table = tensor_table(cfg_);
    std::map<std::string, size_t> idx;
    for (size_t i = 0; i < table.size(); ++i) idx[table[i].name] = i;
    store_->tensors.assign(table.size(), TypedPtr{});
    auto set = [&](const std::string& ours, TypedPtr p) { store_->tensors[idx.at(ours)] = p; };
    std::set<std::string> used;
    const int64_t C = cfg_.d_model, V = cfg_.vocab_size, F = cfg_.ffn_dim;

    set("embed_tokens.weight", in_place(get("model.embed_tokens.weight", {V, C}, used)));
    for (int64_t l = 0; l < cfg_.n_layers; ++l) {
      const std::string hf = "model.layers." + std::to_string(l) + ".";
      const std::string p = "layers." + std::to_string(l) + ".";
      set(p + "attn_norm.weight", small(get(hf + "input_layernorm.weight", {C}, used)));
      // q | k | v: one permuted copy per layer
      const Located q = get(hf + "self_attn.q_proj.weight", {L_.H * L_.d, C}, used);
      const Located k = get(hf + "self_attn.k_proj.weight", {L_.Hkv * L_.d, C}, used);
      const Located v = get(hf + "self_attn.v_proj.weight", {L_.Hkv * L_.d, C}, used);
      const nn::AttnLayerShape s = cfg_.attn_shape(l);
      const int64_t nq = s.n_q(), nk = L_.Hkv * L_.d;  // nq: the project's q rows
      const TypedPtr proj = permuted_qkv(q, k, v, C, nullptr, nq);
      const size_t es = dtype_size(proj.dtype);
      const auto* base = static_cast<const uint8_t*>(proj.data);
      set(p + "attn.q_proj.weight", proj);
      set(p + "attn.k_proj.weight", {base + static_cast<size_t>(nq * C) * es, proj.dtype});
      set(p + "attn.v_proj.weight", {base + static_cast<size_t>((nq + nk) * C) * es, proj.dtype});
      if (cfg_.attn_bias) {
        const Located qb = get(hf + "self_attn.q_proj.bias", {nq}, used);
        const Located kb = get(hf + "self_attn.k_proj.bias", {nk}, used);
        const Located vb = get(hf + "self_attn.v_proj.bias", {nk}, used);
        const float* b = permuted_qkv_bias(qb, kb, vb);
        set(p + "attn.q_proj.bias", typed(b));
        set(p + "attn.k_proj.bias", typed(b + nq));
        set(p + "attn.v_proj.bias", typed(b + nq + nk));
        set(p + "attn.out_proj.bias", small(get(hf + "self_attn.o_proj.bias", {C}, used)));
      }
      set(p + "attn.out_proj.weight", in_place(get(hf + "self_attn.o_proj.weight", {C, s.n_out()}, used)));
      if (L_.diff) {
        for (const char* n : {"lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"}) {
          set(p + "attn." + n, small(get(hf + "self_attn." + n, {L_.d}, used)));
        }
        if (L_.motif) {
          set(p + "attn.subln.weight", small(get(hf + "self_attn.subln.weight", {2 * L_.d}, used)));
        } else {
          // DiffLlama's per-head RMSNorm has no weight: ones.
          store_->small.emplace_back(static_cast<size_t>(2 * L_.d), 1.0f);
          set(p + "attn.subln.weight", typed(store_->small.back().data()));
        }
      }
      set(p + "ffn_norm.weight", small(get(hf + "post_attention_layernorm.weight", {C}, used)));
      set(p + "ffn.gate_proj.weight", in_place(get(hf + "mlp.gate_proj.weight", {F, C}, used)));
      set(p + "ffn.up_proj.weight", in_place(get(hf + "mlp.up_proj.weight", {F, C}, used)));
      set(p + "ffn.down_proj.weight", in_place(get(hf + "mlp.down_proj.weight", {C, F}, used)));
      if (cfg_.mlp == MlpKind::PolyNorm) {
        set(p + "ffn.act_fn.weight", small(get(hf + "mlp.act_fn.weight", {3}, used)));
        set(p + "ffn.act_fn.bias", small(get(hf + "mlp.act_fn.bias", {1}, used)));
      }
      if (cfg_.mlp_bias) {
        set(p + "ffn.gate_proj.bias", small(get(hf + "mlp.gate_proj.bias", {F}, used)));
        set(p + "ffn.up_proj.bias", small(get(hf + "mlp.up_proj.bias", {F}, used)));
        set(p + "ffn.down_proj.bias", small(get(hf + "mlp.down_proj.bias", {C}, used)));
      }
    }
    set("norm.weight", small(get("model.norm.weight", {C}, used)));
    if (!cfg_.tie_embeddings) set("lm_head.weight", in_place(get("lm_head.weight", {V, C}, used)));

    // Anything else in the checkpoint is a layout this reader does not know: an error, except
    // the RoPE buffers older exports saved and an lm_head that tying replaces.
    for (const auto& [name, file] : shards_.names()) {
      if (used.count(name)) continue;
      static const std::string kRotary = "rotary_emb.inv_freq";
      const bool rotary = name.size() >= kRotary.size() &&
                          name.compare(name.size() - kRotary.size(), kRotary.size(), kRotary) == 0;
      if (rotary || (cfg_.tie_embeddings && name == "lm_head.weight")) continue;
      throw IoError(dir_ + "/" + file + ": extra tensor " + quote_name(name) +
                    " is not part of a " + family() + " model with this config.json");
    }
    store_->description = std::string("Hugging Face ") +
                          (L_.motif ? "motif" : L_.diff ? "diffllama" : "llama") + ", " +
                          stored_types() + ", " + std::to_string(store_->files.size()) +
                          (store_->files.size() == 1 ? " file" : " files") + " memory-mapped";
    return store_;
  }

 private:
  std::string family() const { return L_.motif ? "Motif" : L_.diff ? "DiffLlama" : "Llama"; }
  Located get(const std::string& name, const Shape& shape, std::set<std::string>& used) {
    Located t = shards_.get(name, shape);
    check_finite(t);
    used.insert(name);
    dtypes_[name] = t.entry->dtype;
    return t;
  }
  // The stored types of the tensors read, e.g. "BF16" or "BF16+F32".
  std::string stored_types() const {
    std::set<std::string> names;
    for (const auto& [tensor, dt] : dtypes_) names.insert(dtype_name(dt));
    std::string out;
    for (const std::string& n : names) out += (out.empty() ? "" : "+") + n;
    return out;
  }

  // The tensor where it lies in the mapping (copied only when misaligned for its type).
  TypedPtr in_place(const Located& t) {
    const DType dt = t.entry->dtype;
    t.file->will_need(t.entry->begin, t.entry->end);
    if (reinterpret_cast<uintptr_t>(t.bytes()) % dtype_size(dt) == 0) return {t.bytes(), dt};
    const size_t n = static_cast<size_t>(t.entry->end - t.entry->begin);
    store_->owned.emplace_back(n + 4);
    uint8_t* dst = store_->owned.back().data();
    dst += (4 - reinterpret_cast<uintptr_t>(dst) % 4) % 4;
    std::memcpy(dst, t.bytes(), n);
    t.file->drop(t.entry->begin, t.entry->end);
    return {dst, dt};
  }

  // A small tensor as float32.
  TypedPtr small(const Located& t) {
    std::vector<float> f(static_cast<size_t>(t.entry->numel));
    copy_f32(f.data(), t, 0, t.entry->numel);
    store_->small.push_back(std::move(f));
    return typed(store_->small.back().data());
  }

  // n elements of t from element `from` as float32 (alignment-safe).
  static void copy_f32(float* dst, const Located& t, int64_t from, int64_t n) {
    const DType dt = t.entry->dtype;
    const size_t es = dtype_size(dt);
    const uint8_t* src = t.bytes() + static_cast<size_t>(from) * es;
    if (dt == DType::F32) {
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    }
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, src + static_cast<size_t>(i) * 2, 2);
      dst[i] = dt == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
  }

  int64_t q_src(int64_t r) const { return perm_.q_src(r); }
  int64_t k_src(int64_t r) const { return perm_.k_src(r); }
  int64_t v_src(int64_t r) const { return perm_.v_src(r); }

  // q | k | v stacked and permuted, in their common stored type (float32 when they differ);
  // `extra` (V2's lambda_proj) is appended as it is, so the block is the layer's one product.
  // nq_out: the q rows produced (0: q's own; Motif repeats shared noise rows).
  TypedPtr permuted_qkv(const Located& q, const Located& k, const Located& v, int64_t C,
                        const Located* extra = nullptr, int64_t nq_out = 0) {
    const bool same = q.entry->dtype == k.entry->dtype && q.entry->dtype == v.entry->dtype &&
                      (!extra || extra->entry->dtype == q.entry->dtype);
    const DType dt = same ? q.entry->dtype : DType::F32;
    const size_t es = dtype_size(dt);
    const int64_t nq = nq_out ? nq_out : q.entry->shape[0], nk = k.entry->shape[0];  // v has nk rows too
    const int64_t ne = extra ? extra->entry->shape[0] : 0;
    const int64_t rows = nq + 2 * nk + ne;
    const size_t row_bytes = static_cast<size_t>(C) * es;
    check_fits_in_memory(static_cast<double>(rows) * static_cast<double>(row_bytes),
                         "the permuted q/k/v projections of one layer");
    store_->owned.emplace_back(static_cast<size_t>(rows) * row_bytes + 4);
    uint8_t* dst = store_->owned.back().data();
    dst += (4 - reinterpret_cast<uintptr_t>(dst) % 4) % 4;
    auto copy_rows = [&](uint8_t* out, const Located& t, int64_t n, auto src_of) {
      const size_t src_es = dtype_size(t.entry->dtype);
      for (int64_t r = 0; r < n; ++r) {
        const int64_t s = src_of(r);
        uint8_t* o = out + static_cast<size_t>(r) * row_bytes;
        if (t.entry->dtype == dt) {
          std::memcpy(o, t.bytes() + static_cast<size_t>(s * C) * src_es, row_bytes);
        } else {
          copy_f32(reinterpret_cast<float*>(o), t, s * C, C);
        }
      }
      t.file->drop(t.entry->begin, t.entry->end);
    };
    copy_rows(dst, q, nq, [&](int64_t r) { return q_src(r); });
    copy_rows(dst + static_cast<size_t>(nq) * row_bytes, k, nk, [&](int64_t r) { return k_src(r); });
    copy_rows(dst + static_cast<size_t>(nq + nk) * row_bytes, v, nk,
              [&](int64_t r) { return v_src(r); });
    if (extra) {
      copy_rows(dst + static_cast<size_t>(nq + 2 * nk) * row_bytes, *extra, ne,
                [](int64_t r) { return r; });
    }
    return {dst, dt};
  }

  const float* permuted_qkv_bias(const Located& q, const Located& k, const Located& v) {
    const int64_t nq = q.entry->shape[0], nk = k.entry->shape[0];
    std::vector<float> qf(static_cast<size_t>(nq)), kf(static_cast<size_t>(nk)), vf(static_cast<size_t>(nk));
    copy_f32(qf.data(), q, 0, nq);
    copy_f32(kf.data(), k, 0, nk);
    copy_f32(vf.data(), v, 0, nk);
    std::vector<float> b(static_cast<size_t>(nq + 2 * nk));
    for (int64_t r = 0; r < nq; ++r) b[static_cast<size_t>(r)] = qf[static_cast<size_t>(q_src(r))];
    for (int64_t r = 0; r < nk; ++r) {
      b[static_cast<size_t>(nq + r)] = kf[static_cast<size_t>(k_src(r))];
      b[static_cast<size_t>(nq + nk + r)] = vf[static_cast<size_t>(v_src(r))];
    }
    store_->small.push_back(std::move(b));
    return store_->small.back().data();
  }

  std::string dir_;
  ModelConfig cfg_;
  ArchLayout L_;
  Permutation perm_;
  std::shared_ptr<HfStore> store_;
  Shards shards_;
  std::map<std::string, DType> dtypes_;
};

}  // namespace

std::map<std::string, std::string> parse_hf_weight_map(const std::string& text,
                                                       const std::string& where) {
  const json j = parse_json_object(text, where);
  if (!j.contains("weight_map") || !j.at("weight_map").is_object()) {
    throw IoError(where + ": missing \"weight_map\" (an object from tensor name to file)");
  }
  std::map<std::string, std::string> out;
  for (const auto& [name, f] : j.at("weight_map").items()) {
    if (!f.is_string()) {
      throw IoError(where + ": weight_map[" + quote_name(name) + "] must be a file name, got " +
                    json_brief(f));
    }
    const std::string file = f.get<std::string>();
    if (file.empty() || file.find('/') != std::string::npos || file.find('\0') != std::string::npos ||
        file == "." || file == "..") {
      throw IoError(where + ": weight_map[" + quote_name(name) + "] names " + json_brief(f) +
                    ", which is not a file name inside the directory");
    }
    out[name] = file;
  }
  return out;
}

bool is_hf_model_dir(const std::string& dir) {
  const std::string p = dir + "/config.json";
  if (!file_exists(p)) return false;
  json j;
  try {
    j = parse_json_object(read_file(p, kMaxJsonFileBytes), p);
  } catch (const Error&) {
    return false;  // the project's reader reports what is wrong with it
  }
  return j.contains("model_type") && !j.contains("format");
}

ModelConfig hf_model_config(const std::string& text, const std::string& where) {
  return parse_hf_config(parse_json_object(text, where), where, nullptr);
}

std::shared_ptr<const WeightStore> load_weight_store(const ModelDir& dir) {
  Loader loader(dir);
  if (dir.layout->native) return loader.load_native();
  return dir.layout->sambay ? loader.load_sambay() : loader.load();
}

}  // namespace diffattn

namespace diffattn {

namespace {

using HfTensors = std::vector<std::pair<std::string, std::pair<Shape, std::vector<float>>>>;

std::string write_hf_dir(const HfTensors& out, const json& j, const std::string& dir, DType dtype,
                         int64_t shards, const ModelFiles& files);

// Motif-2's published layout (docs/models/motif2.md, "Tensors"): the inverse of the loader's
// head mapping; each group's noise query head is the (equal) copy its pairs hold.
void motif_tensors(const Model& m, DType dtype, HfTensors& out, json& j);

}  // namespace

std::string save_hf_model(const Model& m, const std::string& dir, DType dtype, int64_t shards,
                          const ModelFiles& files) {
  const ModelConfig& c = m.config();
  if (m.config().recurrent()) {
    throw InvalidArgument("saving a phi4flash (SambaY) model is not supported: it is read from "
                          "its Hugging Face directory as published, and run there");
  }
  if (shards < 1 || shards > 9999) {
    throw InvalidArgument("shards must be between 1 and 9999, got " + std::to_string(shards));
  }
  if (c.mlp == MlpKind::PolyNorm) {
    HfTensors out;
    json j;
    motif_tensors(m, dtype, out, j);
    return write_hf_dir(out, j, dir, dtype, shards, files);
  }
  if (c.lambda_init_shift != 0 || c.noise_share != 1 ||
      (c.subln_eps && *c.subln_eps != c.norm_eps)) {
    throw InvalidArgument("the model has Motif-2 attention settings (lambda_init_shift, "
                          "noise_share or subln_eps) but a SwiGLU MLP; neither DiffLlama nor Motif-2 "
                          "computes that");
  }
  const bool diff = c.attention == nn::AttnKind::DiffV1;
  if (c.attention == nn::AttnKind::DiffV2) {
    throw InvalidArgument("transformers has no DIFF V2 model; only diff_v1 (DiffLlama) and "
                          "standard (Llama) models can be written as Hugging Face directories");
  }
  if (diff && c.lambda_init) {
    for (int64_t l = 0; l < c.n_layers; ++l) {
      const double sched = 0.8 - 0.6 * std::exp(-0.3 * static_cast<double>(l));
      if (static_cast<float>(*c.lambda_init) != static_cast<float>(sched)) {
        throw InvalidArgument("the model has a fixed lambda_init = " +
                              std::to_string(*c.lambda_init) +
                              "; DiffLlama always uses 0.8 - 0.6 exp(-0.3 l), so its logits would differ");
      }
    }
  }
  ArchLayout L;
  L.diff = diff;
  L.H = diff ? 2 * c.n_heads : c.n_heads;
  L.Hkv = diff ? 2 * c.n_kv_heads : c.n_kv_heads;
  L.d = c.head_dim;
  const Permutation perm{L};
  const int64_t C = c.d_model;

  // Every tensor as float32 under its transformers name, permuted back to halves / rotate-half.
  HfTensors out;
  auto put = [&](const std::string& name, Shape shape, std::vector<float> data) {
    out.push_back({name, {std::move(shape), std::move(data)}});
  };
  auto rows_back = [&](const std::vector<float>& ours, int64_t rows, int64_t cols, auto src_of) {
    std::vector<float> hf(ours.size());
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(&hf[static_cast<size_t>(src_of(r) * cols)], &ours[static_cast<size_t>(r * cols)],
                  sizeof(float) * static_cast<size_t>(cols));
    }
    return hf;
  };
  put("model.embed_tokens.weight", {c.vocab_size, C}, m.weight_f32("embed_tokens.weight"));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    const std::string hf = "model.layers." + std::to_string(l) + ".";
    const nn::AttnLayerShape s = c.attn_shape(l);
    put(hf + "input_layernorm.weight", {C}, m.weight_f32(p + "attn_norm.weight"));
    const int64_t nq = L.H * L.d, nk = L.Hkv * L.d;
    auto q = [&](int64_t r) { return perm.q_src(r); };
    auto k = [&](int64_t r) { return perm.k_src(r); };
    auto v = [&](int64_t r) { return perm.v_src(r); };
    put(hf + "self_attn.q_proj.weight", {nq, C}, rows_back(m.weight_f32(p + "attn.q_proj.weight"), nq, C, q));
    put(hf + "self_attn.k_proj.weight", {nk, C}, rows_back(m.weight_f32(p + "attn.k_proj.weight"), nk, C, k));
    put(hf + "self_attn.v_proj.weight", {nk, C}, rows_back(m.weight_f32(p + "attn.v_proj.weight"), nk, C, v));
    if (c.attn_bias) {
      put(hf + "self_attn.q_proj.bias", {nq}, rows_back(m.weight_f32(p + "attn.q_proj.bias"), nq, 1, q));
      put(hf + "self_attn.k_proj.bias", {nk}, rows_back(m.weight_f32(p + "attn.k_proj.bias"), nk, 1, k));
      put(hf + "self_attn.v_proj.bias", {nk}, rows_back(m.weight_f32(p + "attn.v_proj.bias"), nk, 1, v));
      put(hf + "self_attn.o_proj.bias", {C}, m.weight_f32(p + "attn.out_proj.bias"));
    }
    std::vector<float> o = m.weight_f32(p + "attn.out_proj.weight");  // (C, H*Dv)
    if (diff) {
      // (1 - lambda_init) * rmsnorm(o_h) * w feeds o_proj: w moves into o_proj's columns.
      const std::vector<float> w = m.weight_f32(p + "attn.subln.weight");  // (2D)
      const int64_t no = s.n_out(), Dv = s.Dv();
      for (int64_t r = 0; r < C; ++r) {
        for (int64_t col = 0; col < no; ++col) {
          float& x = o[static_cast<size_t>(r * no + col)];
          x = static_cast<float>(static_cast<double>(x) * w[static_cast<size_t>(col % Dv)]);
        }
      }
      for (const char* n : {"lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"}) {
        put(hf + "self_attn." + n, {L.d}, m.weight_f32(p + "attn." + n));
      }
    }
    put(hf + "self_attn.o_proj.weight", {C, s.n_out()}, std::move(o));
    put(hf + "post_attention_layernorm.weight", {C}, m.weight_f32(p + "ffn_norm.weight"));
    put(hf + "mlp.gate_proj.weight", {c.ffn_dim, C}, m.weight_f32(p + "ffn.gate_proj.weight"));
    put(hf + "mlp.up_proj.weight", {c.ffn_dim, C}, m.weight_f32(p + "ffn.up_proj.weight"));
    put(hf + "mlp.down_proj.weight", {C, c.ffn_dim}, m.weight_f32(p + "ffn.down_proj.weight"));
    if (c.mlp_bias) {
      put(hf + "mlp.gate_proj.bias", {c.ffn_dim}, m.weight_f32(p + "ffn.gate_proj.bias"));
      put(hf + "mlp.up_proj.bias", {c.ffn_dim}, m.weight_f32(p + "ffn.up_proj.bias"));
      put(hf + "mlp.down_proj.bias", {C}, m.weight_f32(p + "ffn.down_proj.bias"));
    }
  }
  put("model.norm.weight", {C}, m.weight_f32("norm.weight"));
  if (!c.tie_embeddings) put("lm_head.weight", {c.vocab_size, C}, m.weight_f32("lm_head.weight"));

  // config.json in transformers 4.x's spelling (rope_theta + rope_scaling), read by 5.x too.
  json j;
  j["architectures"] = {diff ? "DiffLlamaForCausalLM" : "LlamaForCausalLM"};
  j["model_type"] = diff ? "diffllama" : "llama";
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = C;
  j["intermediate_size"] = c.ffn_dim;
  j["num_hidden_layers"] = c.n_layers;
  j["num_attention_heads"] = L.H;
  j["num_key_value_heads"] = L.Hkv;
  j["head_dim"] = L.d;
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = c.max_seq_len;
  j["rms_norm_eps"] = c.norm_eps;
  j["rope_theta"] = c.rope_theta;
  if (c.rope_scaling.type == nn::RopeScaling::Type::None) {
    j["rope_scaling"] = nullptr;
  } else {
    json r = {{"rope_type", nn::rope_type_name(c.rope_scaling.type)}, {"factor", c.rope_scaling.factor}};
    if (c.rope_scaling.type == nn::RopeScaling::Type::Llama3) {
      r["low_freq_factor"] = c.rope_scaling.low_freq_factor;
      r["high_freq_factor"] = c.rope_scaling.high_freq_factor;
      r["original_max_position_embeddings"] = c.rope_scaling.original_max_position_embeddings;
    }
    j["rope_scaling"] = r;
  }
  j["tie_word_embeddings"] = c.tie_embeddings;
  j["attention_bias"] = c.attn_bias;
  j["attention_dropout"] = 0.0;
  if (diff) {
    j["lambda_std_dev"] = 0.1;
  } else {
    j["mlp_bias"] = c.mlp_bias;
    j["pretraining_tp"] = 1;
  }
  j["initializer_range"] = 0.02;
  j["use_cache"] = true;
  j["torch_dtype"] = dtype == DType::F32 ? "float32" : dtype == DType::BF16 ? "bfloat16" : "float16";

  return write_hf_dir(out, j, dir, dtype, shards, files);
}

namespace {

std::string write_hf_dir(const HfTensors& out, const json& j, const std::string& dir, DType dtype,
                         int64_t shards, const ModelFiles& files) {
  // The whole directory is written beside DIR and swapped in (DirectoryUpdate): shards of about
  // equal bytes, in the order above, their index, the configs.
  DirectoryUpdate u(dir);
  int64_t total = 0;
  for (const auto& t : out) total += static_cast<int64_t>(t.second.second.size());
  const int64_t n_files = std::min<int64_t>(shards, static_cast<int64_t>(out.size()));
  // Tensor i goes to file_of[i]: a file is closed once it holds its share of the bytes, as
  // long as every later file still gets a tensor.
  std::vector<int64_t> file_of(out.size());
  {
    int64_t f = 0, bytes = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      const int64_t left = static_cast<int64_t>(out.size() - i);
      if (bytes > 0 && f + 1 < n_files &&
          (bytes * n_files >= total || left <= n_files - f - 1)) {
        ++f;
        bytes = 0;
      }
      file_of[i] = f;
      bytes += static_cast<int64_t>(out[i].second.second.size());
    }
  }
  json weight_map = json::object();
  for (int64_t f = 0; f < n_files; ++f) {
    char name[64];
    if (n_files == 1) {
      std::snprintf(name, sizeof name, "model.safetensors");
    } else {
      std::snprintf(name, sizeof name, "model-%05lld-of-%05lld.safetensors",
                    static_cast<long long>(f + 1), static_cast<long long>(n_files));
    }
    std::vector<SafeTensorRef> refs;
    for (size_t i = 0; i < out.size(); ++i) {
      if (file_of[i] != f) continue;
      refs.push_back({out[i].first, out[i].second.first, out[i].second.second.data()});
      weight_map[out[i].first] = name;
    }
    write_safetensors(u.path(name), refs, {{"format", "pt"}}, dtype);
  }
  if (n_files > 1) {
    json index = {{"metadata", {{"total_size", total * static_cast<int64_t>(dtype_size(dtype))}}},
                  {"weight_map", weight_map}};
    u.write("model.safetensors.index.json", index.dump(2) + "\n");
  }
  u.write("generation_config.json", json{{"_from_model_config", true}}.dump(2) + "\n");
  u.write("config.json", j.dump(2) + "\n");
  return commit_model_dir(u, dir, files);
}

void motif_tensors(const Model& m, DType dtype, HfTensors& out, json& j) {
  const ModelConfig& c = m.config();
  if (c.attention != nn::AttnKind::DiffV1 || c.lambda_init || c.lambda_init_shift != 1 ||
      c.attn_bias || c.mlp_bias || c.rope_scaling.type != nn::RopeScaling::Type::None) {
    throw InvalidArgument("a PolyNorm model is written as Motif-2 (MotifForCausalLM), which "
                          "needs diff_v1 attention with lambda_init_shift 1, no fixed lambda_init, no "
                          "biases and no rope_scaling");
  }
  ArchLayout L;
  L.diff = L.motif = true;
  L.S = c.noise_share + 1;
  L.G = c.n_heads / c.noise_share;
  L.H = c.n_heads + L.G;
  L.Hkv = 2 * c.n_kv_heads;
  L.d = c.head_dim;
  const Permutation perm{L};
  const int64_t C = c.d_model, d = L.d;
  auto put = [&](const std::string& name, Shape shape, std::vector<float> data) {
    out.push_back({name, {std::move(shape), std::move(data)}});
  };
  put("model.embed_tokens.weight", {c.vocab_size, C}, m.weight_f32("embed_tokens.weight"));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    const std::string hf = "model.layers." + std::to_string(l) + ".";
    const nn::AttnLayerShape s = c.attn_shape(l);
    put(hf + "input_layernorm.weight", {C}, m.weight_f32(p + "attn_norm.weight"));
    // q: every project row r lands at perm.q_src(r); the copies of a noise head must agree.
    const std::vector<float> q = m.weight_f32(p + "attn.q_proj.weight");
    std::vector<float> hq(static_cast<size_t>(L.H * d * C));
    std::vector<char> seen(static_cast<size_t>(L.H * d), 0);
    for (int64_t r = 0; r < s.n_q(); ++r) {
      const int64_t dst = perm.q_src(r);
      const float* src = &q[static_cast<size_t>(r * C)];
      float* o = &hq[static_cast<size_t>(dst * C)];
      if (seen[static_cast<size_t>(dst)] &&
          std::memcmp(o, src, sizeof(float) * static_cast<size_t>(C)) != 0) {
        throw InvalidArgument("layer " + std::to_string(l) + ": the pairs sharing noise head " +
                              std::to_string(dst / d) + " hold different copies of it (noise_share = " +
                              std::to_string(c.noise_share) + "); Motif-2 stores one");
      }
      std::memcpy(o, src, sizeof(float) * static_cast<size_t>(C));
      seen[static_cast<size_t>(dst)] = 1;
    }
    put(hf + "self_attn.q_proj.weight", {L.H * d, C}, std::move(hq));
    const std::vector<float> k = m.weight_f32(p + "attn.k_proj.weight");
    std::vector<float> hk(k.size());
    for (int64_t r = 0; r < L.Hkv * d; ++r) {
      std::memcpy(&hk[static_cast<size_t>(perm.k_src(r) * C)], &k[static_cast<size_t>(r * C)],
                  sizeof(float) * static_cast<size_t>(C));
    }
    put(hf + "self_attn.k_proj.weight", {L.Hkv * d, C}, std::move(hk));
    put(hf + "self_attn.v_proj.weight", {L.Hkv * d, C}, m.weight_f32(p + "attn.v_proj.weight"));
    put(hf + "self_attn.o_proj.weight", {C, s.n_out()}, m.weight_f32(p + "attn.out_proj.weight"));
    for (const char* n : {"lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"}) {
      put(hf + "self_attn." + n, {d}, m.weight_f32(p + "attn." + n));
    }
    put(hf + "self_attn.subln.weight", {2 * d}, m.weight_f32(p + "attn.subln.weight"));
    put(hf + "post_attention_layernorm.weight", {C}, m.weight_f32(p + "ffn_norm.weight"));
    put(hf + "mlp.gate_proj.weight", {c.ffn_dim, C}, m.weight_f32(p + "ffn.gate_proj.weight"));
    put(hf + "mlp.up_proj.weight", {c.ffn_dim, C}, m.weight_f32(p + "ffn.up_proj.weight"));
    put(hf + "mlp.down_proj.weight", {C, c.ffn_dim}, m.weight_f32(p + "ffn.down_proj.weight"));
    put(hf + "mlp.act_fn.weight", {3}, m.weight_f32(p + "ffn.act_fn.weight"));
    put(hf + "mlp.act_fn.bias", {1}, m.weight_f32(p + "ffn.act_fn.bias"));
  }
  put("model.norm.weight", {C}, m.weight_f32("norm.weight"));
  if (!c.tie_embeddings) put("lm_head.weight", {c.vocab_size, C}, m.weight_f32("lm_head.weight"));

  // config.json in the published spelling (docs/models/motif2.md, "config.json")
  j["architectures"] = {"MotifForCausalLM"};
  j["model_type"] = "Motif";
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = C;
  j["intermediate_size"] = c.ffn_dim;
  j["num_hidden_layers"] = c.n_layers;
  j["num_attention_heads"] = L.H;
  j["num_key_value_heads"] = L.Hkv;
  j["head_dim"] = d;
  if (L.S > 2) {
    j["num_noise_heads"] = L.G;
    j["k_ratio"] = 1;
  }
  j["hidden_act"] = "poly_norm";
  j["max_position_embeddings"] = c.max_seq_len;
  j["rms_norm_eps"] = c.norm_eps;
  j["attn_rms_norm_eps"] = c.subln_eps ? *c.subln_eps : c.norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["rope_scaling"] = nullptr;
  j["tie_word_embeddings"] = c.tie_embeddings;
  j["use_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["initializer_range"] = 0.02;
  j["use_cache"] = true;
  j["torch_dtype"] = dtype == DType::F32 ? "float32" : dtype == DType::BF16 ? "bfloat16" : "float16";
}

}  // namespace

}  // namespace diffattn
