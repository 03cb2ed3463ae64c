// Fuzzes the Hugging Face directory's JSON readers (docs/FORMAT.md, "Hugging Face directories"):
// a config.json through hf_model_config (then the tensor table and the project's own config
// round trip of what it accepted), the same bytes as model.safetensors.index.json, and as a
// generation_config.json through stop_ids_for (a model of 256 ids: every id it returns is one).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "diffattn/model/checkpoint.h"
#include "diffattn/model/config.h"
#include "diffattn/model/safetensors.h"
#include "diffattn/train/train.h"

namespace {

char g_dir[] = "/tmp/fuzz_hf_config.XXXXXX";

void remove_dir() {
  std::error_code ec;
  std::filesystem::remove_all(g_dir, ec);
}

const std::string& dir() {
  static const std::string d = [] {
    if (::mkdtemp(g_dir) == nullptr) std::abort();
    std::atexit(remove_dir);
    return std::string(g_dir);
  }();
  return d;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const diffattn::model::ModelConfig cfg = diffattn::model::hf_model_config(text, "fuzz/config.json");
    (void)diffattn::model::tensor_table(cfg);
    (void)diffattn::model::ModelConfig::from_json(cfg.to_json(), "round trip");
  } catch (const diffattn::Error&) {
  }
  try {
    (void)diffattn::model::parse_hf_weight_map(text, "fuzz/model.safetensors.index.json");
  } catch (const diffattn::Error&) {
  }
  static const auto bytes = diffattn::data::byte_tokenizer();
  try {
    std::ofstream(dir() + "/generation_config.json", std::ios::binary | std::ios::trunc) << text;  // no fsync
    for (int32_t id : diffattn::train::stop_ids_for(dir(), *bytes, 256)) {
      if (id < 0 || id >= 256) std::abort();  // an id the model cannot produce got through
    }
  } catch (const diffattn::Error&) {
  }
  return 0;
}
