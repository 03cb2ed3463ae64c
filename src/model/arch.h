// The model room's private seam between a resolved model directory (model_dir.cpp) and the
// readers of its families (hf_model.cpp): the checkpoint's own head layout and the functions
// that translate a config.json and map the weight files.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "diffattn/model/config.h"
#include "diffattn/model/model.h"
#include "diffattn/model/model_dir.h"

namespace diffattn {

// What the permutations need beyond the ModelConfig: the checkpoint's own head counts.
// `native`: the project's own layout (no permutation, the project's tensor names).
struct ArchLayout {
  bool diff = false;
  bool native = false;
  bool motif = false;  // Motif-2 (diff too): G noise heads, each closing a group of S query heads
  int64_t H = 0, Hkv = 0, d = 0;
  int64_t G = 0, S = 0;
  bool sambay = false;  // Phi-4-mini-flash: tensors under their published names, no permutation
};

// A transformers config.json onto the project's config; layout (when given) receives the
// checkpoint's head layout. Errors name `where` and the key.
ModelConfig parse_hf_config(const nlohmann::json& j, const std::string& where, ArchLayout* layout);

// The weights of a resolved directory kept as loaded: the project's format with 16-bit tensors
// (dir.layout->native), a transformers family otherwise.
std::shared_ptr<const WeightStore> load_weight_store(const ModelDir& dir);

}  // namespace diffattn
