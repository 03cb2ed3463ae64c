// The language model's description (docs/FORMAT.md, "config.json"): ModelConfig, the one source
// every other description derives from (the tensor table, parameter counts, the presets, the
// V2 rule of equal size, the Hugging Face mapping in checkpoint.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "diffattn/base/error.h"
#include "diffattn/nn/attention_layer.h"
#include "diffattn/nn/layers.h"

namespace diffattn::model {

// The feed-forward block: SwiGLU (down(silu(gate x) * up x)) or PolyNorm (Motif-2:
// down(PolyNorm(gate x) * up x), PolyNorm(z) = w0 N(z^3) + w1 N(z^2) + w2 N(z) + b, N an RMS norm
// over the row with eps kPolyNormEps; tensors ffn.act_fn.weight (3) and ffn.act_fn.bias (1)).
enum class MlpKind { SwiGLU, PolyNorm };
const char* mlp_kind_name(MlpKind k);  // "swiglu", "polynorm"
constexpr float kPolyNormEps = 1e-6f;

// The layer stack. Decoder: every layer RMSNorm, attention, RMSNorm, FFN (the project's models,
// Llama, DiffLlama, Motif-2). SambaY: Phi-4-mini-flash's hybrid (docs/models/phi4flash.md):
// LayerNorms with bias, no positional encoding, a mixer per layer by LayerKind, an MLP fc1 =
// [gate | up], fc2; inference only, run by infer::Session with per-sequence recurrent state.
enum class Arch { Decoder, SambaY };
// What a layer mixes tokens with. SambaY (L layers, h = L / 2): Mamba on even layers up to h
// (layer h, the memory layer, also gives its pre-gate scan output to the GMUs), sliding-window
// attention on odd layers below h, full attention on h + 1 (its keys and values are the YOCO
// cache), then GMU (even) and cross attention (odd: own queries, layer h + 1's keys/values).
enum class LayerKind { Attention, Mamba, SlidingAttention, FullAttention, Gmu, CrossAttention };
const char* layer_kind_name(LayerKind k);

// Phi-4-mini-flash's Mamba-1 and window sizes (config.json's mamba_* keys and sliding_window).
struct SambaYSizes {
  int64_t d_state = 16;  // N
  int64_t d_conv = 4;    // K
  int64_t expand = 2;    // E = expand * d_model
  int64_t dt_rank = 0;   // R = ceil(d_model / 16)
  int64_t window = 0;    // W: keys a sliding-window query sees, itself included
};

struct ModelConfig {
  Arch arch = Arch::Decoder;
  SambaYSizes sambay;  // Arch::SambaY only
  nn::AttnKind attention = nn::AttnKind::DiffV1;
  int64_t vocab_size = 256;
  int64_t d_model = 0;
  int64_t n_layers = 0;
  int64_t n_heads = 0;     // V1: pairs H; V2: output heads H (2H query heads); standard: heads
  int64_t n_kv_heads = 0;  // G, divides n_heads
  int64_t head_dim = 0;    // D
  int64_t ffn_dim = 0;
  int64_t max_seq_len = 0;
  double rope_theta = 10000.0;
  float norm_eps = 1e-5f;
  bool tie_embeddings = false;
  std::optional<double> lambda_init;  // absent: 0.8 - 0.6 exp(-0.3 l), l 0-based
  nn::RopeScaling rope_scaling;       // none by default
  bool attn_bias = false;  // q, k, v and out projections have biases (diff_v1, standard)
  bool mlp_bias = false;   // gate, up and down projections have biases
  MlpKind mlp = MlpKind::SwiGLU;
  // diff_v1 lambda_init schedule 0.8 - 0.6 exp(-0.3 (l - shift)), l 0-based: 0 the paper's (and
  // DiffLlama's), 1 Motif-2's (the paper's 1-based formula applied to the 0-based index).
  int64_t lambda_init_shift = 0;
  std::optional<float> subln_eps;  // diff_v1's per-head RMSNorm eps; absent: norm_eps
  // diff_v1: consecutive pairs that share one noise query head (grouped differential attention,
  // Motif-2-12.7B: 4). Their noise query rows are stored once per pair (equal copies), so every
  // path runs them as ordinary pairs; 1: every pair has its own.
  int64_t noise_share = 1;

  // lambda_init of layer l (0-based): the fixed value or the paper's schedule
  // (arXiv:2410.05258 section 2.1, with its 1-based l - 1 written as the 0-based l), shifted by
  // lambda_init_shift layers.
  float layer_lambda_init(int64_t l) const;
  nn::AttnLayerShape attn_shape(int64_t l) const;
  LayerKind layer_kind(int64_t l) const;
  // SambaY: the layer whose scan output the GMUs read, the layer whose K/V the cross layers read.
  int64_t memory_layer() const { return n_layers / 2; }
  int64_t yoco_layer() const { return n_layers / 2 + 1; }
  // Inference keeps per-sequence state besides K/V (Mamba states, sliding windows): no prefix
  // cache, no training.
  bool recurrent() const { return arch == Arch::SambaY; }
  int64_t mamba_inner() const { return sambay.expand * d_model; }
  // Throws InvalidArgument naming the key when a size is out of range or inconsistent.
  void validate(const std::string& where = "config") const;
  std::string to_json() const;
  // Parses config.json text; unknown keys, missing keys and wrong types are errors naming the
  // key and `where` (the file).
  static ModelConfig from_json(const std::string& text, const std::string& where);
};

nn::AttnKind parse_attn_kind(const std::string& name, const std::string& where);

// Presets "tiny" and "small" for each attention kind, of (nearly) equal parameter counts:
// V1 matches standard exactly (H pairs of 2D replace 2H heads of D); V2's extra query heads
// and lambda_proj are paid for by a smaller ffn_dim (see README).
ModelConfig model_preset(const std::string& name, nn::AttnKind kind, int64_t vocab_size = 256);
// The V2 rule of equal size (the one place it is written): V2 adds H*D*C query weights and an
// (H, C) lambda_proj per layer; the SwiGLU's three (ffn, C) matrices give back as many rows,
// rounded to the nearest. Returns the V2 model's ffn_dim for a standard model's ffn.
int64_t v2_matched_ffn_dim(int64_t ffn, int64_t d_model, int64_t n_heads, int64_t head_dim);
// The same rule for any size: n_std heads of d_model / n_std for the standard model (V1: n_std / 2
// pairs, V2: n_std output heads and an FFN shrunk to pay for its extra query heads).
ModelConfig model_of_size(nn::AttnKind kind, int64_t d_model, int64_t n_layers, int64_t n_std,
                          int64_t ffn_dim, int64_t max_seq_len, int64_t vocab_size = 256);

struct TensorInfo {
  std::string name;  // FORMAT.md name, e.g. "layers.0.attn.q_proj.weight"
  Shape shape;
  int64_t offset = 0;  // into the flat buffer
  int64_t numel = 0;
  bool decay = false;  // AdamW weight decay applies (2-D tensors; see README)
};

// The tensors of a config in a fixed order, laid out so that each layer's q, k, v (and V2's
// lambda) projections are contiguous (one stacked (n_proj, C) weight) and so are gate and up.
std::vector<TensorInfo> tensor_table(const ModelConfig& cfg);

// Number of parameters of a config (all tensors).
int64_t count_params(const ModelConfig& cfg);

}  // namespace diffattn::model
