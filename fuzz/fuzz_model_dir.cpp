// Fuzzes the model-directory loader (src/model/model_dir.cpp, checkpoint.cpp, the families arch_*.cpp and hf_reader.cpp) on disk:
// load_model over a fixed tiny config.json and model.safetensors from the input. The first byte
// picks the config (the project's diff_v1, diff_v2, standard, V1 and standard with biases, a
// transformers llama, diffllama, llama with biases and tied embeddings, a grouped Motif-2, the
// project's form of one, and a Phi-4-mini-flash); the rest is the
// weights file, read through the float32 path (all F32) or the memory-mapped one (BF16, F16 or
// mixed, and every transformers directory), or a Phi-4-mini-flash directory (run through an
// inference session: it is inference only). A model that loads must have every tensor finite and
// of its table's size, and a forward over three tokens must run; anything else must be a
// diffattn::Error. The seeds in corpus/model_dir/ are valid files of each config and dtype.
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "diffattn/base/error.h"
#include "diffattn/base/files.h"
#include "diffattn/infer/session.h"
#include "diffattn/model/checkpoint.h"
#include "diffattn/model/model.h"
#include "diffattn/model/train_context.h"

namespace {

char g_dir[] = "/tmp/fuzz_model_dir.XXXXXX";

void remove_dir() {
  std::error_code ec;
  std::filesystem::remove_all(g_dir, ec);
}

// vocab 16, width 8, two layers: every tensor a few dozen values.
const char* const kConfigs[] = {
    R"({"format": "diffattn/1", "attention": "diff_v1", "vocab_size": 16, "d_model": 8, "n_layers": 2,
        "n_heads": 1, "n_kv_heads": 1, "head_dim": 4, "ffn_dim": 8, "max_seq_len": 16,
        "rope_theta": 10000.0, "norm_eps": 1e-5, "tie_embeddings": false})",
    R"({"format": "diffattn/1", "attention": "diff_v2", "vocab_size": 16, "d_model": 8, "n_layers": 2,
        "n_heads": 2, "n_kv_heads": 1, "head_dim": 4, "ffn_dim": 8, "max_seq_len": 16,
        "rope_theta": 10000.0, "norm_eps": 1e-5, "tie_embeddings": false})",
    R"({"format": "diffattn/1", "attention": "standard", "vocab_size": 16, "d_model": 8, "n_layers": 2,
        "n_heads": 2, "n_kv_heads": 1, "head_dim": 4, "ffn_dim": 8, "max_seq_len": 16,
        "rope_theta": 10000.0, "norm_eps": 1e-5, "tie_embeddings": true})",
    R"({"format": "diffattn/1", "attention": "diff_v1", "vocab_size": 16, "d_model": 8, "n_layers": 2,
        "n_heads": 1, "n_kv_heads": 1, "head_dim": 4, "ffn_dim": 8, "max_seq_len": 16,
        "rope_theta": 10000.0, "norm_eps": 1e-5, "tie_embeddings": false, "attention_bias": true})",
    R"({"format": "diffattn/1", "attention": "standard", "vocab_size": 16, "d_model": 8, "n_layers": 2,
        "n_heads": 2, "n_kv_heads": 1, "head_dim": 4, "ffn_dim": 8, "max_seq_len": 16,
        "rope_theta": 10000.0, "norm_eps": 1e-5, "tie_embeddings": false, "attention_bias": true,
        "mlp_bias": true})",
    R"({"model_type": "llama", "vocab_size": 16, "hidden_size": 8, "intermediate_size": 8,
        "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4,
        "max_position_embeddings": 16, "rms_norm_eps": 1e-5, "rope_theta": 10000.0})",
    R"({"model_type": "diffllama", "vocab_size": 16, "hidden_size": 8, "intermediate_size": 8,
        "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 4,
        "max_position_embeddings": 16, "rms_norm_eps": 1e-5, "rope_theta": 10000.0})",
    R"({"model_type": "llama", "vocab_size": 16, "hidden_size": 8, "intermediate_size": 8,
        "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4,
        "max_position_embeddings": 16, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "attention_bias": true, "mlp_bias": true, "tie_word_embeddings": true})",
    // Motif-2 grouped (6 query heads in 2 groups of 3, 2 key/value pairs), tied
    R"({"model_type": "Motif", "vocab_size": 16, "hidden_size": 8, "intermediate_size": 8,
        "num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 4, "head_dim": 4,
        "num_noise_heads": 2, "k_ratio": 1, "hidden_act": "poly_norm", "max_position_embeddings": 16,
        "rms_norm_eps": 1e-6, "attn_rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": true})",
    // the project's form of a Motif-2 model
    R"({"format": "diffattn/1", "attention": "diff_v1", "vocab_size": 16, "d_model": 8, "n_layers": 2,
        "n_heads": 4, "n_kv_heads": 2, "head_dim": 4, "ffn_dim": 8, "max_seq_len": 16,
        "rope_theta": 10000.0, "norm_eps": 1e-6, "tie_embeddings": true, "mlp": "polynorm",
        "lambda_init_shift": 1, "subln_eps": 1e-5, "noise_share": 2})",
    // Phi-4-mini-flash (SambaY): 8 layers, every layer kind, a window of 2
    R"({"model_type": "phi4flash", "vocab_size": 16, "hidden_size": 8, "intermediate_size": 8,
        "num_hidden_layers": 8, "num_attention_heads": 2, "num_key_value_heads": 2,
        "sliding_window": 2, "mamba_d_state": 2, "mamba_d_conv": 2, "layer_norm_eps": 1e-5,
        "max_position_embeddings": 16, "tie_word_embeddings": true, "mb_per_layer": 2})",
};
constexpr size_t kNumConfigs = sizeof(kConfigs) / sizeof(kConfigs[0]);

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (::mkdtemp(g_dir) == nullptr) std::abort();
  std::atexit(remove_dir);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string dir = g_dir;
  diffattn::write_file_atomic(dir + "/config.json", kConfigs[data[0] % kNumConfigs]);
  diffattn::write_file_atomic(dir + "/model.safetensors",
                              std::string(reinterpret_cast<const char*>(data + 1), size - 1));
  try {
    diffattn::model::Model m = diffattn::model::load_model(dir);
    for (const diffattn::model::TensorInfo& t : m.tensors()) {
      const std::vector<float> w = m.weight_f32(t.name);
      if (static_cast<int64_t>(w.size()) != t.numel) std::abort();
      for (float x : w) {
        if (!std::isfinite(x)) std::abort();  // the loader promises finite weights
      }
    }
    const int32_t tokens[3] = {1, 15, 7};
    if (m.config().recurrent()) {  // inference only: a session, a prompt chunk and a decode step
      diffattn::infer::KvStore kv(m, diffattn::infer::KvStore::Contiguous{4});
      diffattn::infer::Session session(m, kv);
      diffattn::infer::Batch b;
      std::vector<float> logits(16);
      b.add_chunk(tokens, 3, 0, 0);
      session.decode(b, logits.data());
      b.clear();
      b.add(2, 3, 0, true);
      session.decode(b, logits.data());
      return 0;
    }
    diffattn::model::TrainContext run(m);
    run.forward(tokens, nullptr, 1, 3);
    if (run.logits().size() != 3 * 16) std::abort();
  } catch (const diffattn::Error&) {
  }
  return 0;
}
