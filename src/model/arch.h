// The architecture registry (docs/DESIGN.md, "model"): each family a checkpoint directory can
// hold is one file, src/model/arch_<family>.cpp, giving its config.json translation (with what
// the published code would compute differently refused), its head layout, how its weights are
// read and how a model is written back in its layout; arch.cpp lists them and picks one by
// config.json's model_type (the project's own format, arch_diffattn.cpp, by "format"). A new
// family is a new file and one line in that list. The layer bodies: the Llama-like families
// (Llama, DiffLlama, Motif-2) are translated onto the project's model, whose one decoder layer
// (Model::layer) runs them; Phi-4-mini-flash's SambaY layers are phi4flash.cpp's and
// src/infer/sambay.cpp's.
// The machinery they share lives in hf_reader.cpp (memory-mapped shards, the q/k/v
// permutation, the Llama-like tensor names) and hf_writer.cpp (sharded, atomic directories).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "diffattn/model/checkpoint.h"
#include "diffattn/model/config.h"
#include "diffattn/model/model.h"
#include "diffattn/model/model_dir.h"

namespace diffattn::model {

// What the permutations need beyond the ModelConfig: the checkpoint's own head counts.
// `native`: the project's own layout (no permutation, the project's tensor names).
struct ArchFamily;
struct ArchLayout {
  const ArchFamily* family = nullptr;  // the registry's entry (kDiffattnFamily: the project's)
  bool diff = false;
  bool native = false;
  bool motif = false;  // Motif-2 (diff too): G noise heads, each closing a group of S query heads
  int64_t H = 0, Hkv = 0, d = 0;
  int64_t G = 0, S = 0;
  bool sambay = false;  // Phi-4-mini-flash: tensors under their published names, no permutation
};

// config.json's keys, read with the checks every family shares; errors name `where` and the key.
class ConfigKeys {
 public:
  ConfigKeys(const nlohmann::json& j, std::string where) : j_(j), where_(std::move(where)) {}
  const nlohmann::json& json() const { return j_; }
  const std::string& where() const { return where_; }
  bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }
  const nlohmann::json& need(const char* key) const;  // present and not null
  int64_t integer(const char* key) const;             // required, 1 .. 2^24
  int64_t integer_or(const char* key, int64_t dflt) const;
  double number_or(const char* key, double dflt) const;
  bool boolean_or(const char* key, bool dflt) const;
  // "WHERE: KEY VALUE is not supported (WHY)"
  [[noreturn]] void refuse(const char* key, const std::string& why) const;

 private:
  const nlohmann::json& j_;
  std::string where_;
};

// One family of checkpoint directories.
struct ArchFamily {
  const char* name;  // config.json's model_type as the family's own config spells it
  // Whether config.json's model_type (as written) names this family.
  bool (*matches)(const std::string& model_type);
  // config.json onto the project's config (checked with ModelConfig::validate); layout receives
  // the checkpoint's head layout.
  ModelConfig (*translate)(const ConfigKeys& keys, ArchLayout& layout);
  // The weights of a resolved directory of this family, kept as loaded.
  std::shared_ptr<const WeightStore> (*load)(const ModelDir& dir);
  // Writes m in this family's layout (config.json, generation_config.json, model.safetensors
  // or shards with their index); nullptr when the family is read only. `writes` says whether
  // m is a model of this family's layout.
  bool (*writes)(const ModelConfig& c);
  std::string (*save)(const Model& m, const std::string& dir, DType dtype, int64_t shards,
                      const ModelFiles& files);
};

extern const ArchFamily kDiffattnFamily;   // arch_diffattn.cpp: the project's format
extern const ArchFamily kLlamaFamily;      // arch_llama.cpp
extern const ArchFamily kDiffLlamaFamily;  // arch_diffllama.cpp
extern const ArchFamily kMotifFamily;      // arch_motif.cpp
extern const ArchFamily kPhi4FlashFamily;  // arch_phi4flash.cpp

// The registry (arch.cpp): every transformers family, in the order config.json's model_type is
// tried against them (the project's format, kDiffattnFamily, is picked by "format").
const std::vector<const ArchFamily*>& arch_families();

// A transformers config.json onto the project's config, through the family its model_type
// names; layout (when given) receives the checkpoint's head layout.
ModelConfig parse_hf_config(const nlohmann::json& j, const std::string& where, ArchLayout* layout);

// The one loader: the weights of a resolved directory as a store, the project's format
// (dir.layout->native: OwnedWeights when every tensor is float32, so the model trains, else
// kept as stored and mapped) or through its family. load_model(dir) is Model(config, this).
std::shared_ptr<const WeightStore> load_weight_store(const ModelDir& dir);

// ---- shared by the families (arch_llama.cpp: the Llama-like layout the others extend) ----

// The Llama-like config.json for layout L (L.diff, L.motif set by the family): the sizes, the
// head layout (DiffLlama's halves, Motif-2's groups) and RoPE every Llama-like family shares;
// max_position_embeddings defaults to default_positions. The family checks the result
// (ModelConfig::validate) once it has set its own fields.
ModelConfig translate_llama_like(const ConfigKeys& k, ArchLayout& L, int64_t default_positions);

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

// Readers (hf_reader.cpp): the Llama-like tensor names (Llama, DiffLlama, Motif-2: q/k/v rows
// permuted once), Phi-4-mini-flash's published names as they are, the project's own format
// (dir.layout->native; its header checked against the config first).
std::shared_ptr<const WeightStore> load_llama_like(const ModelDir& dir);
std::shared_ptr<const WeightStore> load_sambay_weights(const ModelDir& dir);
std::shared_ptr<const WeightStore> load_native_weights(const ModelDir& dir);
// (checkpoint.cpp) The project's model.safetensors at path whose header h load_native_weights
// checked against cfg (check_weights_header) and found all F32: the owned weights of a trainable
// model, each tensor copied once from the memory-mapped file (its pages dropped after the copy)
// and checked finite, with load_weights' errors.
std::shared_ptr<OwnedWeights> read_f32_weights(const std::string& path, const SafeTensorsHeader& h,
                                               const ModelConfig& cfg);

// Writers (hf_writer.cpp): tensors as float32 under their transformers names, in order.
using HfTensors = std::vector<std::pair<std::string, std::pair<Shape, std::vector<float>>>>;
// The directory, atomically: shards of about equal bytes stored as dtype, their index, config.json
// (j), generation_config.json, files.extra.
std::string write_hf_dir(const HfTensors& out, const nlohmann::json& j, const std::string& dir,
                         DType dtype, int64_t shards, const ModelFiles& files);
// Llama / DiffLlama (arch_llama.cpp): m's tensors back in the halves / rotate-half layout and its
// config.json; diff: DiffLlama's lambdas, o_proj with the subln weight folded in.
std::string save_llama_like(const Model& m, const std::string& dir, DType dtype, int64_t shards,
                            const ModelFiles& files, bool diff);
// "float32", "bfloat16" or "float16": config.json's torch_dtype.
const char* torch_dtype_name(DType dtype);

}  // namespace diffattn::model
