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

#include "diffattn/error.h"
#include "diffattn/model.h"

namespace diffattn {

// The architecture fields of config.json (docs/FORMAT.md); `attention` is "standard",
// "diff_v1" or "diff_v2".
struct ArchConfig {
  std::string attention = "standard";
  int64_t vocab_size = 0, d_model = 0, n_layers = 0, ffn_dim = 0;
  int64_t n_heads = 0;     // standard: heads; V1: pairs H; V2: output heads H (2H query heads)
  int64_t n_kv_heads = 0;  // G
  int64_t head_dim = 0;    // D
  bool tie_embeddings = false;
};

// A standard model size from which the three versions are derived, as the paper and the V2
// write-up do: V1 has H/2 pairs of sub-heads of the same head size (so q/k/v/out keep their
// sizes) and G/2 key/value groups whose values are 2D wide; V2 keeps H output heads and G
// key/value heads and doubles the query heads.
struct BaseSize {
  int64_t vocab_size = 32000, d_model = 4096, n_layers = 32, n_heads = 32, n_kv_heads = 32;
  int64_t head_dim = 128, ffn_dim = 11008;
  bool tie_embeddings = false;
};

ArchConfig standard_of(const BaseSize& b);
ArchConfig diff_v1_of(const BaseSize& b);  // InvalidArgument if heads or kv heads are odd
ArchConfig diff_v2_of(const BaseSize& b);
// ffn_dim that brings V2's parameter count closest to the standard model's (the V2 write-up
// borrows the extra query parameters from the FFN up-projection).
int64_t v2_matched_ffn(const BaseSize& b);

struct TensorSpec {
  std::string name;       // FORMAT.md name, e.g. "layers.3.attn.q_proj.weight"
  std::vector<int64_t> shape;
  std::string component;  // embeddings, attention, lambda, norms, ffn, head
};

// Every tensor FORMAT.md lists for this config, in its order. Throws InvalidArgument (naming
// the field) for sizes that are not positive or G not dividing H.
std::vector<TensorSpec> format_tensors(const ArchConfig& c);
// The ModelConfig of an architecture (max_seq_len 1: no tensor depends on it); format_tensors
// is tensor_table of it, so the model and the accounting share one tensor list.
ModelConfig model_config_of(const ArchConfig& c);

struct Accounting {
  ArchConfig config;
  std::map<std::string, int64_t> params_by_component;
  int64_t params = 0;
  double linear_flops_per_token = 0;   // all layers + lm_head
  double attn_flops_per_token = 0;     // at context T, all layers
  double attn_flops_per_key = 0;       // all layers, per key the query attends to
  double kv_cache_bytes_per_token = 0; // at bytes_per_value
  double decode_read_bytes_fused = 0;  // K/V bytes read per decoded token per key, V read once
  double decode_read_bytes_two_pass = 0;  // two softmax passes each reading V (V1 recipe)
};

Accounting account(const ArchConfig& c, int64_t context, double bytes_per_value);

// Forward FLOPs of a whole causal sequence of T tokens: T x linear + attention summed over
// contexts 1..T.
double sequence_flops(const Accounting& a, int64_t T);

}  // namespace diffattn

namespace diffattn {

// The architecture fields of a config.json (docs/FORMAT.md) or of a model directory holding
// one. Unknown keys, missing keys and wrong types are errors naming the key and the file.
ArchConfig read_arch_config(const std::string& path);
ArchConfig parse_arch_config(const std::string& json_text, const std::string& source);

// The standard size a config is a version of (inverse of standard_of / diff_v1_of / diff_v2_of).
BaseSize base_of(const ArchConfig& c);

}  // namespace diffattn
