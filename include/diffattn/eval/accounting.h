// Parameter, FLOP and KV-cache accounting for standard, DIFF V1 and DIFF V2 versions of one
// model size. Parameters are counted over exactly the tensors docs/FORMAT.md lists for each
// attention kind (format_tensors), so a loaded model's tensors can be checked against it.
//
// Conventions: 2 FLOPs per multiply-add. "Per token at context T": one query row attending to
// T keys (the T-th token of a causal sequence), forward only. Linear FLOPs: 2 x the weights of
// every matrix product a token goes through (embedding lookup excluded, lm_head included).
// Attention FLOPs: the QK^T and PV products as FlashAttention counts them (softmax, lambda and
// norms excluded). KV-cache bytes: what one token adds to the cache, all layers.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "diffattn/base/error.h"
#include "diffattn/model/config.h"

namespace diffattn::eval {

// Sizes are ModelConfigs, the one description of a model (max_seq_len plays no part here).
// A standard model and its differential versions, as the paper and the V2 write-up derive them:
// V1 has H/2 pairs of sub-heads of the same head size (so q/k/v/out keep their sizes) and G/2
// key/value groups whose values are 2D wide; V2 keeps H output heads and G key/value heads and
// doubles the query heads.
// The Llama-7B-class example: vocab 32000, d_model 4096, 32 layers of 32 heads of 128, ffn 11008.
model::ModelConfig example_7b();
model::ModelConfig diff_v1_of(const model::ModelConfig& standard);  // InvalidArgument if heads or kv heads are odd
model::ModelConfig diff_v2_of(const model::ModelConfig& standard);
// ffn_dim that brings V2's parameter count closest to the standard model's (the V2 write-up
// borrows the extra query parameters from the FFN up-projection).
int64_t v2_matched_ffn(const model::ModelConfig& standard);
// The standard model a version comes from (the inverse of diff_v1_of / diff_v2_of).
model::ModelConfig base_of(const model::ModelConfig& c);

struct TensorSpec {
  std::string name;       // FORMAT.md name, e.g. "layers.3.attn.q_proj.weight"
  std::vector<int64_t> shape;
  std::string component;  // embeddings, attention, lambda, norms, ffn, head
};

// Every tensor FORMAT.md lists for this config, in its order: tensor_table (the model's own
// list) with each tensor's component. Throws InvalidArgument (naming the field) for a config
// that does not validate.
std::vector<TensorSpec> format_tensors(const model::ModelConfig& c);

struct Accounting {
  model::ModelConfig config;
  std::map<std::string, int64_t> params_by_component;
  int64_t params = 0;
  double linear_flops_per_token = 0;   // all layers + lm_head
  double attn_flops_per_token = 0;     // at context T, all layers
  double attn_flops_per_key = 0;       // all layers, per key the query attends to
  double kv_cache_bytes_per_token = 0; // at bytes_per_value
  double decode_read_bytes_fused = 0;  // K/V bytes read per decoded token per key, V read once
  double decode_read_bytes_two_pass = 0;  // two softmax passes each reading V (V1 recipe)
};

Accounting account(const model::ModelConfig& c, int64_t context, double bytes_per_value);

// Forward FLOPs of a whole causal sequence of T tokens: T x linear + attention summed over
// contexts 1..T.
double sequence_flops(const Accounting& a, int64_t T);

}  // namespace diffattn::eval

namespace diffattn::eval {

// The config of a config.json file or a model directory (diffattn's, or a Hugging Face Llama /
// DiffLlama one, read as the model it loads as). Errors name the key and the file.
model::ModelConfig read_model_config(const std::string& path);

}  // namespace diffattn::eval
