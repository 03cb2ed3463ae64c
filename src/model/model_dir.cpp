// A model directory resolved once (include/diffattn/model/model_dir.h): config.json read and
// translated once, the weight files listed, the side files read once.
#include "diffattn/model/model_dir.h"

#include <sys/stat.h>

#include <nlohmann/json.hpp>
#include <set>

#include "diffattn/base/error.h"
#include "diffattn/base/files.h"
#include "diffattn/base/json_util.h"
#include "diffattn/model/checkpoint.h"
#include "diffattn/model/safetensors.h"
#include "model/arch.h"

namespace diffattn::model {

namespace {

bool is_file(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::optional<std::string> read_if_there(const std::string& p) {
  if (!is_file(p)) return std::nullopt;
  return read_file(p, kMaxJsonFileBytes);
}

}  // namespace

ModelDir open_model_dir(const std::string& dir) {
  check_model_dir(dir);
  ModelDir d;
  d.path = dir;
  d.config_path = dir + "/config.json";
  const std::string text = read_file(d.config_path, kMaxJsonFileBytes);
  // A transformers directory: config.json has model_type and no "format". Text that is not a
  // JSON object is the project's reader's to report (ModelConfig::from_json names what is wrong).
  nlohmann::json j;
  bool parsed = false;
  try {
    j = parse_json_object(text, d.config_path);
    parsed = true;
  } catch (const Error&) {
  }
  auto layout = std::make_shared<ArchLayout>();
  d.hf = parsed && j.contains("model_type") && !j.contains("format");
  if (d.hf) {
    d.config = parse_hf_config(j, d.config_path, layout.get());
    d.family = layout->family->name;
  } else {
    // The project's format; text that is not a JSON object gets its reader's error.
    if (!parsed) (void)ModelConfig::from_json(text, d.config_path);
    layout->family = &kDiffattnFamily;
    d.config = kDiffattnFamily.translate(ConfigKeys(j, d.config_path), *layout);
    d.family = kDiffattnFamily.name;
  }
  d.layout = layout;

  // The weights: transformers' index when there is one (the project's format is always the one
  // file), else model.safetensors.
  const std::string one = d.file("model.safetensors");
  const std::string index = d.file("model.safetensors.index.json");
  if (d.hf && is_file(index)) {
    if (is_file(one)) {
      // transformers loads model.safetensors when both are there, an index reader the shards:
      // one of them is a stale leftover, and which one is not for a reader to guess.
      throw IoError(dir + ": holds both model.safetensors and model.safetensors.index.json (transformers "
                    "would load model.safetensors and ignore the index's shards); one of them is "
                    "left over from another model: remove it");
    }
    d.weight_index = index;
    d.weight_map = parse_hf_weight_map(read_file(index, kMaxJsonFileBytes), index);
    std::set<std::string> seen;
    for (const auto& [tensor, file] : d.weight_map) {
      if (seen.insert(file).second) d.weight_files.push_back(file);
    }
  } else {
    // (The project's format: a missing file is the safetensors reader's error, at load.)
    if (d.hf && !is_file(one)) {
      throw IoError(dir + ": no model.safetensors and no model.safetensors.index.json");
    }
    d.weight_files = {"model.safetensors"};
  }

  if (is_file(d.file("tokenizer.json"))) {
    d.tokenizer_path = d.file("tokenizer.json");
  } else if (is_file(d.file("tokenizer.model"))) {
    d.tokenizer_path = d.file("tokenizer.model");
  }
  d.tokenizer_config = read_if_there(d.file("tokenizer_config.json"));
  d.generation_config = read_if_there(d.file("generation_config.json"));
  return d;
}

Model load_model(const ModelDir& d) { return Model(d.config, load_weight_store(d)); }

Model load_model(const std::string& dir) { return load_model(open_model_dir(dir)); }

}  // namespace diffattn::model
