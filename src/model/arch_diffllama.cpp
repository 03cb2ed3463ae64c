// DiffLlama (transformers' DiffLlamaForCausalLM, model_type "diffllama"), read as the project's
// diff_v1 model: the Llama-like layout (arch_llama.cpp) with differential head i made of query
// heads i and i + H/2 and key/value heads g and g + Hkv/2 ("halves", mapped onto the project's
// adjacent pairs by Permutation, arch.h), four lambda vectors per layer, and a per-head RMSNorm
// without weight (read as ones; a learned one is folded into o_proj when writing).
#include <nlohmann/json.hpp>

#include "model/arch.h"

namespace diffattn::model {

namespace {

ModelConfig translate(const ConfigKeys& k, ArchLayout& L) {
  L.diff = true;
  ModelConfig c = translate_llama_like(k, L, 2048);
  if (c.mlp_bias) {
    throw InvalidArgument(k.where() + ": mlp_bias is true, but DiffLlama's MLP has no biases");
  }
  c.validate(k.where());
  return c;
}

}  // namespace

const ArchFamily kDiffLlamaFamily = {
    "diffllama",
    [](const std::string& t) { return t == "diffllama"; },
    translate,
    load_llama_like,
    [](const ModelConfig& c) { return c.mlp != MlpKind::PolyNorm && c.attention == nn::AttnKind::DiffV1; },
    [](const Model& m, const std::string& dir, DType dtype, int64_t shards, const ModelFiles& files) {
      return save_llama_like(m, dir, dtype, shards, files, true);
    },
};

}  // namespace diffattn::model
