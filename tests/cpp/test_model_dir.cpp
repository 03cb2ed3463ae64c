// A model directory resolved once (include/diffattn/model/model_dir.h): what open_model_dir
// finds in the project's format and in a sharded transformers directory, that the model, the
// tokenizer and the stop ids built from it equal those read from the path, and that the side
// files are read once (removing them after open_model_dir changes nothing).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "diffattn/base/error.h"
#include "diffattn/base/files.h"
#include "diffattn/data/data.h"
#include "diffattn/model/checkpoint.h"
#include "diffattn/model/model_dir.h"
#include "diffattn/train/train.h"
#include "temp_dir.h"

namespace diffattn {
namespace {

using testing::TempDir;

std::string tokenizer_data() {
  const char* env = std::getenv("DIFFATTN_TOKENIZER_DATA");
  return env && *env ? env : DIFFATTN_TOKENIZER_DATA_DEFAULT;
}

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

void put(const std::string& p, const std::string& text) {
  std::ofstream f(p, std::ios::binary);
  f << text;
}

model::ModelConfig small(nn::AttnKind kind) {
  model::ModelConfig c;
  c.attention = kind;
  c.vocab_size = 37;
  c.d_model = 16;
  c.n_layers = 2;
  c.ffn_dim = 24;
  c.max_seq_len = 16;
  c.head_dim = 4;
  c.n_heads = kind == nn::AttnKind::Standard ? 4 : 2;
  c.n_kv_heads = kind == nn::AttnKind::Standard ? 2 : 1;
  return c;
}

// Every tensor of a and b equal bit for bit (as float32).
void expect_same_weights(const model::Model& a, const model::Model& b) {
  ASSERT_EQ(a.tensors().size(), b.tensors().size());
  for (const model::TensorInfo& t : a.tensors()) {
    EXPECT_EQ(a.weight_f32(t.name), b.weight_f32(t.name)) << t.name;
  }
}

void copy_llama3_tokenizer(const std::string& dir) {
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    std::filesystem::copy_file(tokenizer_data() + "/llama3/" + f, dir + "/" + f);
  }
}

TEST(ModelDir, ProjectFormat) {
  TempDir t;
  const std::string dir = t / "m";
  model::Model m(small(nn::AttnKind::DiffV1));
  m.init_weights(3);
  model::save_model(m, dir);
  put(dir + "/generation_config.json", "{\"eos_token_id\": [5, 7]}");
  const model::ModelDir d = model::open_model_dir(dir);
  EXPECT_EQ(d.family, "diffattn");
  EXPECT_FALSE(d.hf);
  EXPECT_EQ(d.config.to_json(), m.config().to_json());
  EXPECT_EQ(d.weight_files, std::vector<std::string>{"model.safetensors"});
  EXPECT_TRUE(d.weight_index.empty());
  EXPECT_TRUE(d.tokenizer_path.empty());
  EXPECT_FALSE(d.tokenizer_config.has_value());
  ASSERT_TRUE(d.generation_config.has_value());
  const model::Model a = model::load_model(d), b = model::load_model(dir);
  EXPECT_TRUE(a.trainable());
  expect_same_weights(a, m);
  expect_same_weights(a, b);
  const auto tok = data::tokenizer_for(d);
  EXPECT_EQ(tok->name(), data::byte_tokenizer()->name());
  EXPECT_EQ(train::stop_ids_for(d, *tok, 37), (std::vector<int32_t>{5, 7}));
  // A 16-bit save is an inference model over the mapped file, through the same directory object.
  const std::string dir16 = t / "m16";
  model::save_model(m, dir16, DType::BF16);
  const model::Model c = model::load_model(model::open_model_dir(dir16));
  EXPECT_FALSE(c.trainable());
  expect_same_weights(c, model::load_model(dir16));
}

TEST(ModelDir, ShardedTransformersDirectory) {
  for (nn::AttnKind kind : {nn::AttnKind::Standard, nn::AttnKind::DiffV1}) {
    TempDir t;
    const std::string dir = t / "hf";
    model::Model m(small(kind));
    m.init_weights(5);
    model::save_hf_model(m, dir, DType::F32, 2);
    copy_llama3_tokenizer(dir);
    const model::ModelDir d = model::open_model_dir(dir);
    EXPECT_TRUE(d.hf);
    EXPECT_EQ(d.family, kind == nn::AttnKind::Standard ? "llama" : "diffllama");
    EXPECT_EQ(d.weight_files.size(), 2u);
    EXPECT_EQ(d.weight_index, dir + "/model.safetensors.index.json");
    EXPECT_FALSE(d.weight_map.empty());
    for (const auto& [tensor, file] : d.weight_map) {
      EXPECT_NE(std::find(d.weight_files.begin(), d.weight_files.end(), file), d.weight_files.end());
    }
    EXPECT_EQ(d.tokenizer_path, dir + "/tokenizer.json");
    ASSERT_TRUE(d.tokenizer_config.has_value());
    EXPECT_EQ(*d.tokenizer_config, slurp(dir + "/tokenizer_config.json"));
    expect_same_weights(model::load_model(d), model::load_model(dir));
    if (kind == nn::AttnKind::Standard) continue;  // the tokenizer checks once (Llama 3's: seconds)

    // The tokenizer from the resolved directory is the path's: same ids, same special tokens.
    const auto a = data::tokenizer_for(d), b = data::tokenizer_for(dir);
    const std::string text = "Differential attention cancels noise: 12 + 30 = 42.";
    EXPECT_EQ(a->encode(text), b->encode(text));
    EXPECT_EQ(a->eos_id(), b->eos_id());
    EXPECT_GE(a->eos_id(), 0);
    // Read once: with tokenizer_config.json gone from the disk, the resolved directory still
    // applies it (its eos_token), where a fresh read of the path no longer can.
    std::filesystem::remove(dir + "/tokenizer_config.json");
    EXPECT_EQ(data::tokenizer_for(d)->eos_id(), a->eos_id());
    EXPECT_NE(data::tokenizer_for(dir)->eos_id(), a->eos_id());
  }
}

TEST(ModelDir, Refusals) {
  TempDir t;
  try {
    model::open_model_dir(t / "absent");
    ADD_FAILURE() << "no error";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("not a model directory (no such directory"), std::string::npos) << e.what();
  }
  const std::string dir = t / "hf";
  model::Model m(small(nn::AttnKind::Standard));
  m.init_weights(1);
  model::save_hf_model(m, dir, DType::F32, 2);
  // Both a single file and an index: one of them is stale.
  std::filesystem::copy_file(dir + "/" + model::open_model_dir(dir).weight_files[0], dir + "/model.safetensors");
  try {
    model::open_model_dir(dir);
    ADD_FAILURE() << "no error";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("holds both model.safetensors and model.safetensors.index.json"),
              std::string::npos) << e.what();
  }
  std::filesystem::remove(dir + "/model.safetensors");
  // No tokenizer in a transformers directory: the model's own is refused, bytes are asked for.
  const model::ModelDir d = model::open_model_dir(dir);
  EXPECT_THROW(data::tokenizer_for(d), IoError);
  EXPECT_NO_THROW(data::tokenizer_for(d, data::TokenizerChoice::kBytes));
  // generation_config.json read once, checked against the model's vocabulary when used.
  put(dir + "/generation_config.json", "{\"eos_token_id\": 99}");
  const model::ModelDir d2 = model::open_model_dir(dir);
  EXPECT_THROW(train::stop_ids_for(d2, *data::byte_tokenizer(), 37), IoError);
}

}  // namespace
}  // namespace diffattn
