// Model directories (docs/FORMAT.md): config.json and model.safetensors. Loading checks every
// tensor against the config: a missing tensor, an extra tensor or a disagreeing shape is an
// error naming the tensor and the file.
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "diffattn/model.h"

namespace diffattn {

void save_model(const Model& m, const std::string& dir) {
  make_dirs(dir);
  std::vector<SafeTensorRef> refs;
  for (const TensorInfo& t : m.tensors()) refs.push_back({t.name, t.shape, m.params.data() + t.offset});
  // Weights first, then the config: a reader that finds the new config finds the new weights.
  write_safetensors(dir + "/model.safetensors", refs, {{"format", "diffattn/1"}});
  write_file_atomic(dir + "/config.json", m.config().to_json());
}

void load_weights(Model& m, const SafeTensorsFile& f, const std::string& where,
                  const std::string& prefix, bool allow_extra) {
  for (const TensorInfo& t : m.tensors()) {
    auto it = f.tensors.find(prefix + t.name);
    if (it == f.tensors.end()) {
      throw IoError(where + ": missing tensor \"" + prefix + t.name + "\" of shape " +
                    shape_str(t.shape) + " (the config asks for it)");
    }
    if (it->second.shape != t.shape) {
      throw IoError(where + ": tensor \"" + prefix + t.name + "\" has shape " +
                    shape_str(it->second.shape) + ", the config implies " + shape_str(t.shape));
    }
    std::copy(it->second.data.begin(), it->second.data.end(), m.params.begin() + t.offset);
  }
  if (allow_extra) return;
  for (const auto& [name, t] : f.tensors) {
    if (name.rfind(prefix, 0) != 0) continue;
    bool known = true;
    try {
      m.tensor(name.substr(prefix.size()));
    } catch (const InvalidArgument&) {
      known = false;
    }
    if (!known) {
      throw IoError(where + ": extra tensor \"" + name + "\" of shape " + shape_str(t.shape) +
                    " is not part of a " + nn::attn_kind_name(m.config().attention) +
                    " model with this config" +
                    (m.config().tie_embeddings && name == prefix + "lm_head.weight"
                         ? " (tie_embeddings is true)"
                         : ""));
    }
  }
}

Model load_model(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    throw IoError(dir + ": not a model directory (expected config.json and model.safetensors)");
  }
  const std::string cfg_path = dir + "/config.json";
  const ModelConfig cfg = ModelConfig::from_json(read_file(cfg_path), cfg_path);
  Model m(cfg);
  const std::string w_path = dir + "/model.safetensors";
  load_weights(m, read_safetensors(w_path), w_path);
  return m;
}

}  // namespace diffattn
