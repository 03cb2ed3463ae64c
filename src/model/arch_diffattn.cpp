// The project's own format (docs/FORMAT.md, "diffattn/1"): the DIFF V1 / V2 / standard model of
// config.json with "format", its tensors under the project's names in one model.safetensors.
// A family of the registry like the transformers ones, but picked by config.json's "format"
// (open_model_dir) instead of a model_type, so it is not in arch_families()' list (which also
// names the families a transformers directory may be written as). Its layer body is the one the
// Llama-like families are translated onto (Model::layer, model.cpp); Phi-4-mini-flash's is its
// own (phi4flash.cpp, infer/sambay.cpp).
#include <nlohmann/json.hpp>

#include "diffattn/model/checkpoint.h"
#include "model/arch.h"
#include "model/config_json.h"

namespace diffattn::model {

namespace {

ModelConfig translate(const ConfigKeys& k, ArchLayout& L) {
  L.native = true;
  return config_from_json(k.json(), k.where());
}

}  // namespace

const ArchFamily kDiffattnFamily = {
    "diffattn",
    [](const std::string&) { return false; },  // no model_type: config.json's "format" picks it
    translate,
    load_native_weights,
    [](const ModelConfig& c) { return !c.recurrent(); },
    [](const Model& m, const std::string& dir, DType dtype, int64_t shards, const ModelFiles& files) {
      if (shards != 1) {
        throw InvalidArgument("the diffattn format is one model.safetensors; shards must be 1, got " +
                              std::to_string(shards));
      }
      return save_model(m, dir, dtype, files);
    },
};

}  // namespace diffattn::model
