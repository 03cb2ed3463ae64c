// Fuzzes config.json (docs/FORMAT.md): ModelConfig::from_json, then the tensor table of what it
// accepted. Any input either parses to a valid config or throws a diffattn::Error.
#include <cstddef>
#include <cstdint>
#include <string>

#include "diffattn/model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const diffattn::model::ModelConfig cfg = diffattn::model::ModelConfig::from_json(text, "fuzz/config.json");
    (void)diffattn::model::tensor_table(cfg);
    (void)diffattn::model::ModelConfig::from_json(cfg.to_json(), "round trip");
  } catch (const diffattn::Error&) {
  }
  return 0;
}
