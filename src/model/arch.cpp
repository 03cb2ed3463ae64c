// The architecture registry (src/model/arch.h): the families a checkpoint directory may hold,
// config.json's model_type picking one, and the entry points that go through it.
#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "diffattn/base/files.h"
#include "diffattn/base/json_util.h"
#include "diffattn/model/checkpoint.h"
#include "model/arch.h"

namespace diffattn::model {

using json = nlohmann::json;

const std::vector<const ArchFamily*>& arch_families() {
  static const std::vector<const ArchFamily*> families = {&kLlamaFamily, &kDiffLlamaFamily,
                                                          &kMotifFamily, &kPhi4FlashFamily};
  return families;
}

const nlohmann::json& ConfigKeys::need(const char* key) const {
  if (!has(key)) throw InvalidArgument(where_ + ": missing key \"" + key + "\"");
  return j_.at(key);
}

int64_t ConfigKeys::integer(const char* key) const {
  const nlohmann::json& v = need(key);
  if (!v.is_number_integer()) {
    throw InvalidArgument(where_ + ": \"" + key + "\" must be an integer, got " + json_brief(v));
  }
  const int64_t x = v.get<int64_t>();
  if (x < 1 || x > (int64_t{1} << 24)) {
    throw InvalidArgument(where_ + ": \"" + key + "\" must be between 1 and 2^24, got " +
                          std::to_string(x));
  }
  return x;
}

int64_t ConfigKeys::integer_or(const char* key, int64_t dflt) const {
  return has(key) ? integer(key) : dflt;
}

double ConfigKeys::number_or(const char* key, double dflt) const {
  if (!has(key)) return dflt;
  const nlohmann::json& v = j_.at(key);
  if (!v.is_number()) {
    throw InvalidArgument(where_ + ": \"" + key + "\" must be a number, got " + json_brief(v));
  }
  return v.get<double>();
}

bool ConfigKeys::boolean_or(const char* key, bool dflt) const {
  if (!has(key)) return dflt;
  if (!j_.at(key).is_boolean()) {
    throw InvalidArgument(where_ + ": \"" + key + "\" must be true or false, got " +
                          json_brief(j_.at(key)));
  }
  return j_.at(key).get<bool>();
}

void ConfigKeys::refuse(const char* key, const std::string& why) const {
  throw InvalidArgument(where_ + ": " + key + " " + json_brief(j_.at(key)) + " is not supported (" +
                        why + ")");
}

ModelConfig parse_hf_config(const json& j, const std::string& where, ArchLayout* layout) {
  const ConfigKeys keys(j, where);
  const json& mt = keys.need("model_type");
  const std::string type = mt.is_string() ? mt.get<std::string>() : "";
  for (const ArchFamily* f : arch_families()) {
    if (!f->matches(type)) continue;
    ArchLayout L;
    L.family = f;
    ModelConfig c = f->translate(keys, L);
    if (layout) *layout = L;
    return c;
  }
  std::string names;
  const auto& fs = arch_families();
  for (size_t i = 0; i < fs.size(); ++i) {
    names += std::string(i == 0 ? "" : i + 1 == fs.size() ? " and " : ", ") + "\"" + fs[i]->name + "\"";
  }
  throw InvalidArgument(where + ": model_type " + json_brief(mt) + " is not supported (diffattn reads " +
                        names + ")");
}

bool is_hf_model_dir(const std::string& dir) {
  const std::string p = dir + "/config.json";
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) return false;
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
  return dir.layout->family->load(dir);
}

std::string save_hf_model(const Model& m, const std::string& dir, DType dtype, int64_t shards,
                          const ModelFiles& files) {
  if (m.config().recurrent()) {
    throw InvalidArgument("saving a phi4flash (SambaY) model is not supported: it is read from "
                          "its Hugging Face directory as published, and run there");
  }
  if (shards < 1 || shards > 9999) {
    throw InvalidArgument("shards must be between 1 and 9999, got " + std::to_string(shards));
  }
  for (const ArchFamily* f : arch_families()) {
    if (f->save && f->writes(m.config())) return f->save(m, dir, dtype, shards, files);
  }
  throw InvalidArgument("transformers has no DIFF V2 model; only diff_v1 (DiffLlama) and "
                        "standard (Llama) models can be written as Hugging Face directories");
}

}  // namespace diffattn::model
