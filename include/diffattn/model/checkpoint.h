// Model directories on disk: this project's (config.json + model.safetensors, docs/FORMAT.md)
// and Hugging Face Llama / DiffLlama directories (docs/FORMAT.md, "Hugging Face directories").
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "diffattn/base/dtype.h"
#include "diffattn/model/config.h"
#include "diffattn/model/model.h"
#include "diffattn/model/safetensors.h"

namespace diffattn::model {

// What a save writes beside the weights and config.json, and what of the directory's old
// contents it replaces.
struct ModelFiles {
  // Files of the model (name -> bytes): its tokenizer files, generation_config.json.
  std::map<std::string, std::string> extra;
  // True: the model brings its own tokenizer (in `extra`, or none at all), so the directory's
  // old tokenizer files go with the old model. False: they stay (a save that knows nothing of
  // tokenizers).
  bool replace_tokenizer = false;
};

// Whether an entry of a model directory belongs to the model a save replaces: config.json,
// generation_config.json, the weights under any of transformers' names (model.safetensors, its
// index and model-NNNNN-of-NNNNN shards, pytorch_model*.bin, tf_model.h5, flax_model.msgpack),
// the shards `indexed` names (the old index's), the temporary files of an interrupted atomic
// write of any of those, and, when `tokenizer`, the tokenizer files (tokenizer.json,
// tokenizer_config.json, tokenizer.model, special_tokens_map.json, added_tokens.json,
// vocab.json, merges.txt, chat_template.jinja / .json). Anything else (train_state.safetensors,
// train_log.jsonl, a README) is the user's and is kept.
bool is_model_file(const std::string& name, const std::set<std::string>& indexed, bool tokenizer);

// Saves are atomic for the whole directory (DirectoryUpdate, base/files.h): at every instant,
// a kill -9 included, DIR holds the old model or the new one, complete, and no weight file of
// the old one survives the replacement. They return "" or a note on an entry of the old
// directory that could not be put back (see DirectoryUpdate::commit).
//
// DIR/config.json + DIR/model.safetensors, every tensor stored as dtype (F32: trainable when
// loaded again; BF16/F16: half the bytes, loaded as an inference model), and files.extra.
// Creates DIR if needed.
std::string save_model(const Model& m, const std::string& dir, DType dtype = DType::F32,
                       const ModelFiles& files = {});
// Loads a model directory: load_model(open_model_dir(dir)) (model_dir.h). Every FORMAT.md error
// is reported with the tensor or key and file. A project directory whose model.safetensors is
// all F32 gives a trainable model; one with BF16 or F16 tensors, and a transformers directory
// (Llama, DiffLlama, Motif-2, Phi-4-mini-flash: weights in their stored type, memory-mapped
// where the layout allows, q/k/v rows permuted once onto the project's layout), an inference
// model over the mapped files (Model::trainable() is false).
Model load_model(const std::string& dir);
// An IoError unless DIR is a directory holding config.json, worded the same by every reader of
// a model directory: "DIR: not a model directory (no such directory; ...)" or "(no config.json;
// ...)".
void check_model_dir(const std::string& dir);
// Checks a header's tensor names and shapes against the config's tensor table (missing, extra,
// misshapen: the same errors as load_weights), before any model is allocated.
void check_weights_header(const ModelConfig& cfg, const SafeTensorsHeader& h, const std::string& where,
                          const std::string& prefix = "", bool allow_extra = false);
// A model's tensors from a parsed file, checking names and shapes against the config before
// anything is allocated, and that every value is finite (a NaN or Inf is an error naming the
// tensor and its first index): owned weights laid out by cfg's table (Model(cfg, w) trains them).
std::shared_ptr<OwnedWeights> load_weights(const ModelConfig& cfg, const SafeTensorsFile& f,
                                           const std::string& where, const std::string& prefix = "",
                                           bool allow_extra = false);

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
// Writes a diff_v1 model as a DiffLlama directory, a standard one as a Llama directory
// (config.json, generation_config.json, model.safetensors or `shards` files with their index),
// tensors stored as dtype. What DiffLlama lacks is folded in exactly or refused: V1's learned
// subln weight multiplies o_proj's columns; a fixed lambda_init, diff_v2 and biases on a
// diff_v2 model are errors naming the reason. load_model(dir) gives back the same logits.
// files.extra is written after the model's own files (its generation_config.json wins).
std::string save_hf_model(const Model& m, const std::string& dir, DType dtype = DType::F32,
                          int64_t shards = 1, const ModelFiles& files = {});
// The files a model directory brings beside its weights, to carry them to a converted copy:
// the tokenizer files listed under is_model_file and generation_config.json, those present.
ModelFiles model_side_files(const std::string& dir);

}  // namespace diffattn::model
