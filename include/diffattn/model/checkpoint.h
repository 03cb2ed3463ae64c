// Model directories on disk: this project's (config.json + model.safetensors, docs/FORMAT.md)
// and Hugging Face Llama / DiffLlama directories (docs/FORMAT.md, "Hugging Face directories").
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "diffattn/base/dtype.h"
#include "diffattn/model/config.h"
#include "diffattn/model/model.h"
#include "diffattn/model/safetensors.h"

namespace diffattn {

// DIR/config.json + DIR/model.safetensors, every tensor stored as dtype (F32: trainable when
// loaded again; BF16/F16: half the bytes, loaded as an inference model). Creates DIR if needed.
void save_model(const Model& m, const std::string& dir, DType dtype = DType::F32);
// Loads a model directory; every FORMAT.md error is reported with the tensor or key and file.
// A project directory whose model.safetensors is all F32 gives a trainable model; one with BF16
// or F16 tensors an inference model over the mapped file (load_mapped_model).
Model load_model(const std::string& dir);
// The project's format read like a transformers directory: matrices kept in their stored type
// where they lie in the memory-mapped model.safetensors (each layer's q|k|v(|lambda_proj) one
// copy), 1-D tensors as float32, every value checked finite. cfg is DIR/config.json's, already
// checked against the file's header. Model::trainable() is false.
Model load_mapped_model(const std::string& dir, const ModelConfig& cfg);
// Checks a header's tensor names and shapes against the config's tensor table (missing, extra,
// misshapen: the same errors as load_weights), before any model is allocated.
void check_weights_header(const ModelConfig& cfg, const SafeTensorsHeader& h, const std::string& where,
                          const std::string& prefix = "", bool allow_extra = false);
// Copies a model's tensors from a parsed file, checking names and shapes against the config, and
// that every value is finite (a NaN or Inf is an error naming the tensor and its first index).
void load_weights(Model& m, const SafeTensorsFile& f, const std::string& where,
                  const std::string& prefix = "", bool allow_extra = false);

// Hugging Face checkpoints.
// True when DIR/config.json has a "model_type" (and no "format"): a transformers directory.
bool is_hf_model_dir(const std::string& dir);
// The ModelConfig a transformers config.json ("llama" or "diffllama") maps onto; anything
// unsupported is an error naming `where` and the key.
ModelConfig hf_model_config(const std::string& text, const std::string& where);
// model.safetensors.index.json's weight_map: tensor name -> shard file (a plain name inside the
// directory: no '/', not "." or ".."); errors name `where`.
std::map<std::string, std::string> parse_hf_weight_map(const std::string& text,
                                                       const std::string& where);
// A LlamaForCausalLM or DiffLlamaForCausalLM directory: config.json, model.safetensors or the
// shards of model.safetensors.index.json. Weights stay in their stored type (F32, BF16, F16),
// memory-mapped where the layout allows; q/k/v rows are permuted once onto the project's layout.
// An inference model (Model::trainable() is false). load_model(dir) calls it for such a directory.
Model load_hf_model(const std::string& dir);
// Writes a diff_v1 model as a DiffLlama directory, a standard one as a Llama directory
// (config.json, generation_config.json, model.safetensors or `shards` files with their index),
// tensors stored as dtype. What DiffLlama lacks is folded in exactly or refused: V1's learned
// subln weight multiplies o_proj's columns; a fixed lambda_init, diff_v2 and biases on a
// diff_v2 model are errors naming the reason. load_hf_model(dir) gives back the same logits.
void save_hf_model(const Model& m, const std::string& dir, DType dtype = DType::F32,
                   int64_t shards = 1);

}  // namespace diffattn
