// Fuzzes a training run's resume point (src/train/trainer.cpp): input starting with '{' is
// training options JSON (TrainOptions::from_json, then check_train_options against a small
// config); anything else is a train_state.safetensors file, read in memory
// (parse_safetensors_header) and checked like Trainer::resume does before it allocates
// (check_train_state_header: metadata field by field, tensors against the config), then, when
// that passes, its weights read as Trainer::resume reads them (parse_safetensors, load_weights:
// the model's owned float32 weights, every value finite, or an error) into a model.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "diffattn/model/checkpoint.h"
#include "diffattn/model/model.h"
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
      // The header's tensors lie inside the input, so the weights are no larger than it.
      const diffattn::model::SafeTensorsFile f =
          diffattn::model::parse_safetensors(bytes, "fuzz/train_state.safetensors");
      const diffattn::model::Model m(
          st.config, diffattn::model::load_weights(st.config, f, "fuzz/train_state.safetensors", "", true));
      if (!m.trainable() || m.params().size() != static_cast<size_t>(m.num_params())) std::abort();
      for (float x : m.params()) {
        if (!std::isfinite(x)) std::abort();  // load_weights promises finite weights
      }
    }
  } catch (const diffattn::Error&) {
  }
  return 0;
}
