// A model directory resolved once (docs/DESIGN.md, "model"): which kind of directory it is, its
// config.json parsed and translated, its weight files, where its tokenizer is, and the small
// side files (tokenizer_config.json, generation_config.json) read once as text for the rooms
// above that use them (the tokenizer, the chat templates, the stop ids). Every command, the
// server, the explorer and Python open a directory through it and load the model from it, so
// no file of the directory is parsed twice.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "diffattn/model/config.h"
#include "diffattn/model/model.h"

namespace diffattn::model {

// What a loader needs beyond the ModelConfig: the checkpoint's own head layout (defined in
// src/model/arch.h; opaque here).
struct ArchLayout;

struct ModelDir {
  std::string path;  // as given
  // "diffattn" (the project's format, docs/FORMAT.md) or the architecture family config.json's
  // model_type names (src/model/arch.h's registry): "llama", "diffllama", "Motif", "phi4flash".
  std::string family;
  bool hf = false;         // a transformers directory (config.json has model_type, no format)
  std::string config_path;  // path/config.json
  ModelConfig config;      // config.json translated onto the project's config, checked
  std::shared_ptr<const ArchLayout> layout;
  // Weight files inside the directory, in order: {"model.safetensors"}, or the shards of
  // model.safetensors.index.json with `weight_map` (tensor name -> shard) and `weight_index`
  // the index's path.
  std::vector<std::string> weight_files;
  std::map<std::string, std::string> weight_map;
  std::string weight_index;
  // path/tokenizer.json, else path/tokenizer.model, else "" (no tokenizer file: the byte
  // tokenizer for the project's format; a transformers directory then needs --tokenizer bytes).
  std::string tokenizer_path;
  // The side files' text, read once; nullopt when absent.
  std::optional<std::string> tokenizer_config;   // tokenizer_config.json
  std::optional<std::string> generation_config;  // generation_config.json

  std::string file(const std::string& name) const { return path + "/" + name; }
};

// Resolves DIR. A missing directory or config.json is check_model_dir's IoError; a config.json
// that is not a model's, an index naming a file outside the directory, or both
// model.safetensors and an index present are errors naming the file.
ModelDir open_model_dir(const std::string& dir);

// The model of a resolved directory: a trainable float32 model for the project's format with
// F32 weights, else an inference model over the memory-mapped weights in their stored type.
Model load_model(const ModelDir& dir);

}  // namespace diffattn::model
