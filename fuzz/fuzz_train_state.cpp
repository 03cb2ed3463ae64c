// Fuzzes a training run's resume point (src/data/trainer.cpp) without allocating a model: input
// starting with '{' is training options JSON (TrainOptions::from_json, then check_train_options
// against a small config); anything else is a train_state.safetensors file, read in memory
// (parse_safetensors_header) and checked like Trainer::resume does before it allocates
// (check_train_state_header: metadata field by field, tensors against the config).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "diffattn/train/train.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    if (!bytes.empty() && bytes[0] == '{') {
      const diffattn::train::TrainOptions o = diffattn::train::TrainOptions::from_json(bytes, "fuzz options");
      diffattn::model::ModelConfig cfg;  // the defaults: a small valid model
      diffattn::train::check_train_options(o, cfg);
      (void)diffattn::train::TrainOptions::from_json(o.to_json(), "round trip");
    } else {
      const diffattn::model::SafeTensorsHeader h =
          diffattn::model::parse_safetensors_header(bytes, "fuzz/train_state.safetensors");
      const diffattn::train::TrainState st =
          diffattn::train::check_train_state_header(h, "fuzz/train_state.safetensors");
      if (st.step < 0 || st.step > st.options.steps || st.adamw_t < 0 || st.adamw_t > st.step) std::abort();
    }
  } catch (const diffattn::Error&) {
  }
  return 0;
}
