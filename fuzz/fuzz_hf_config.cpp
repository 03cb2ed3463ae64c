// Fuzzes the Hugging Face directory's JSON readers (docs/FORMAT.md, "Hugging Face directories"):
// a config.json through hf_model_config (then the tensor table and the project's own config
// round trip of what it accepted), and the same bytes as model.safetensors.index.json.
#include <cstddef>
#include <cstdint>
#include <string>

#include "diffattn/model/checkpoint.h"
#include "diffattn/model/config.h"
#include "diffattn/model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const diffattn::ModelConfig cfg = diffattn::hf_model_config(text, "fuzz/config.json");
    (void)diffattn::tensor_table(cfg);
    (void)diffattn::ModelConfig::from_json(cfg.to_json(), "round trip");
  } catch (const diffattn::Error&) {
  }
  try {
    (void)diffattn::parse_hf_weight_map(text, "fuzz/model.safetensors.index.json");
  } catch (const diffattn::Error&) {
  }
  return 0;
}
