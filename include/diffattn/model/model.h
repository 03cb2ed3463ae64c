// The Differential Transformer language model of docs/FORMAT.md ("diffattn/1"): its weights in
// one flat buffer laid out by the tensor table (or kept as loaded, WeightStore), the
// forward/backward over a batch, and the const pieces an infer::Session composes (inference
// runs only there: include/diffattn/infer/). Its description: config.h; files:
// checkpoint.h and safetensors.h; training: optimizer.h; generation: sampler.h.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "diffattn/base/dtype.h"
#include "diffattn/kernels/attention.h"
#include "diffattn/model/config.h"
#include "diffattn/nn/attention_layer.h"
#include "diffattn/nn/mamba.h"

namespace diffattn {

// A SambaY layer's weights (ModelConfig::arch == Arch::SambaY; docs/models/phi4flash.md): its
// two LayerNorms and MLP, and its mixer's weights by kind (mamba: Mamba and GMU; attn: the
// attention kinds, proj holding only the q rows for cross attention).
struct SambaYLayer {
  LayerKind kind = LayerKind::Mamba;
  const float *ln_in_w = nullptr, *ln_in_b = nullptr, *ln_post_w = nullptr, *ln_post_b = nullptr;
  TypedPtr fc1, fc2;  // (2F, C) rows [gate | up]; (C, F)
  nn::MambaWeights mamba;
  nn::AttnLayerWeights attn;
};

// A layer's tensors as indices into tensor_table (-1: absent for this config).
struct LayerTensors {
  int64_t attn_norm = -1, proj = -1, proj_bias = -1, out_proj = -1, out_bias = -1;
  int64_t lambda_q1 = -1, lambda_k1 = -1, lambda_q2 = -1, lambda_k2 = -1, subln = -1;
  int64_t ffn_norm = -1, gate = -1, up = -1, gate_bias = -1, up_bias = -1, down = -1,
          down_bias = -1, act_w = -1, act_b = -1;
};

// Weights kept as loaded instead of in Model::params: one typed view per tensor_table entry
// (BF16 and F16 matrices stay so; the small vectors are float32), and whatever keeps the memory
// alive (memory-mapped files, converted copies). Read only; models built on one share it.
struct WeightStore {
  virtual ~WeightStore() = default;
  std::vector<TypedPtr> tensors;
  std::string description;  // what `diffattn info` shows, e.g. "Hugging Face diffllama, BF16"
};

class Model {
 public:
  // A trainable model: float32 weights and gradients in params / grads.
  explicit Model(const ModelConfig& cfg);
  // An inference model over weights kept as loaded (no params, no grads; backward() refuses).
  Model(const ModelConfig& cfg, std::shared_ptr<const WeightStore> store);

  const ModelConfig& config() const { return cfg_; }
  // False for a model over a WeightStore.
  bool trainable() const { return store_ == nullptr; }
  // Where the weights live: "float32" or the store's description.
  std::string storage() const;
  // A tensor in its stored type, and a float32 copy of it.
  TypedPtr weight(const std::string& name) const;
  std::vector<float> weight_f32(const std::string& name) const;
  const std::vector<TensorInfo>& tensors() const { return table_; }
  const TensorInfo& tensor(const std::string& name) const;  // throws naming the tensor
  int64_t num_params() const;

  // Seeded initialisation: linear weights and embeddings N(0, 0.02), norms 1, V1 lambda
  // vectors N(0, 0.1) (the upstream code's convention). Same seed, same weights.
  void init_weights(uint64_t seed);

  // Forward over tokens (B, T). With targets (B, T) returns the mean cross-entropy over the
  // positions whose target is >= 0; without, 0. Logits stay in logits() (B, T, V).
  double forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T);
  // After forward with targets: grads += d(dloss_scale * mean loss)/dparams.
  void backward(float dloss_scale = 1.0f);
  void zero_grads();
  const std::vector<float>& logits() const { return logits_; }

  // Per-layer lambda: V1 the layer's scalar (Eq. 2); V2 the mean of sigmoid(lambda_proj x) over
  // the last forward's tokens and heads (NaN before any forward); standard: empty.
  std::vector<double> layer_lambdas() const;

  // One attention layer as the last forward() ran it, for looking inside (maps, analysis):
  // `params` views q and k after RoPE, v, lambda (V1: (H) broadcast; V2: (B, T, H)), the output
  // and the saved lse, so attention_probs(params, map, probs) recomputes the maps; nothing is
  // copied and the forward is unchanged (it keeps no T x T buffer). Valid until the next
  // forward; throws before any forward.
  struct LayerAttention {
    kernels::AttnBwdParams params;  // the forward's outputs read only
    nn::AttnLayerShape shape;
  };
  LayerAttention layer_attention(int64_t layer) const;
  // (B, T) of the last forward(); (0, 0) before any.
  int64_t last_batch() const { return B_; }
  int64_t last_len() const { return T_; }

  // ---- what an inference session composes (infer::Session, include/diffattn/infer/) ----
  // Const: one model serves any number of sessions, each bringing its own scratch; the paged
  // KV store, the batch and the serving paths live in the infer room.

  // What one layer's forward keeps for the backward (N = B*T rows); an inference session's
  // scratch for the layer body (its buffers are resized, no allocation once large enough).
  struct LayerActs {
    std::vector<float> x_in;      // (N, C) the residual stream entering the layer
    std::vector<float> an;        // (N, C) rmsnorm(x_in, attn_norm)
    std::vector<float> an_rstd;   // (N)
    std::vector<float> x_mid;     // (N, C) x_in + attn(an)
    std::vector<float> fn;        // (N, C) rmsnorm(x_mid, ffn_norm)
    std::vector<float> fn_rstd;   // (N)
    std::vector<float> gu;        // (N, 2F) [gate_proj fn | up_proj fn]
    std::vector<float> h;         // (N, F) silu(gate) * up
    std::vector<float> attn_out;  // (N, C) scratch: the attention, then the FFN branch output
    nn::AttnLayerActs attn;
  };
  // The attention half of a layer: out (N, C) from an (N, C), the rows already normalised.
  using AttnFn = std::function<void(float* out, const float* an)>;
  // x (N, C) = the embeddings of tokens (N).
  void embed(float* x, const int32_t* tokens, int64_t N) const;
  // Layer l over N rows in place: x = x_mid + ffn(x_mid), x_mid = x + attn(rmsnorm(x)), the
  // body training runs (layer_body), with the caller's attention and scratch a.
  void layer_infer(int64_t l, LayerActs& a, float* x, int64_t N, const AttnFn& attn) const;
  // logits (N, V) of rows x (N, C): the final norm, then the output head; normed and rstd are
  // the caller's scratch.
  void head(float* logits, const float* x, int64_t N, std::vector<float>& normed,
            std::vector<float>& rstd) const;
  nn::AttnLayerWeights attn_weights(int64_t l) const;
  // Arch::SambaY: layer l's weights and the Mamba sizes (throws for another architecture).
  const SambaYLayer& sambay_layer(int64_t l) const;
  nn::MambaShape mamba_shape() const;
  // RoPE's frequencies (D/2), scaled per config().rope_scaling (nn::rope_table's inv_freq).
  const std::vector<double>& rope_inv_freq() const { return inv_freq_; }

  std::vector<float> params;  // flat, laid out by tensors()
  std::vector<float> grads;   // same layout

 private:
  // One decoder layer over N rows, the body training, KV-cache inference and the paged
  // serving paths share: x_out = x_mid + down(silu(gate f) * up f), f = rmsnorm(x_mid),
  // x_mid = x_in + attn(rmsnorm(x_in)), where attn(out, an) is the caller's attention layer
  // (contiguous cache or none, a paged prompt chunk, a paged decode step). a's buffers are
  // resized (no allocation once large enough). x_out may be x_in (inference updates the
  // stream in place). Defined in model.cpp, its only user.
  template <class Attn>
  void layer_body(int64_t l, LayerActs& a, const float* x_in, float* x_out, int64_t N,
                  Attn&& attn) const;
  // layer_body with nn::attn_layer_fwd over (B, T) rows (no cache: inference runs through
  // infer::Session); with save, a keeps what backward() reads.
  void layer_fwd(int64_t l, LayerActs& a, const float* x_in, float* x_out, int64_t B, int64_t T,
                 const float* cos_t, const float* sin_t, bool save);
  // The FFN half of layer_body over BT rows: from a.x_mid to x_out.
  void ffn_fwd(int64_t l, LayerActs& a, float* x_out, int64_t BT) const;
  nn::AttnLayerGrads attn_grads(int64_t l);
  void rope_for(int64_t pos0, int64_t T);
  void require_trainable(const char* what) const;
  // Tensor i of the table: in its stored type, as float32 (throws if stored otherwise), and
  // its offset in params / grads (trainable models).
  TypedPtr wt(int64_t i) const;
  const float* wf(int64_t i) const { return i < 0 ? nullptr : wt(i).f32(); }
  int64_t off(int64_t i) const { return table_[static_cast<size_t>(i)].offset; }
  void index_tensors();
  void index_sambay();  // phi4flash.cpp

  ModelConfig cfg_;
  std::vector<TensorInfo> table_;
  std::map<std::string, size_t> index_;
  std::vector<LayerTensors> lt_;
  // Arch::SambaY: per-layer weights, and the float32 arrays derived from the stored ones at load
  // (conv taps transposed, A = -exp(A_log)), shared by copies of the model.
  std::vector<SambaYLayer> sambay_;
  std::shared_ptr<const std::vector<std::vector<float>>> derived_;
  int64_t embed_ = 0, norm_ = 0, head_ = 0;  // tensor indices
  int64_t norm_bias_ = -1;                     // SambaY's final LayerNorm bias
  std::shared_ptr<const WeightStore> store_;
  std::vector<double> inv_freq_;  // RoPE frequencies (D/2), scaled per cfg_.rope_scaling

  // training activations
  int64_t B_ = 0, T_ = 0;
  std::vector<int32_t> tokens_, targets_;
  std::vector<LayerActs> acts_;
  std::vector<float> x_final_, nf_;      // (N, C) the last layer's output, rmsnorm(., norm)
  std::vector<float> nf_rstd_, lse_, losses_;  // (N)
  std::vector<float> logits_;             // (N, V)
  int64_t counted_ = 0;
  std::vector<float> cos_, sin_;
  int64_t rope_pos0_ = -1, rope_T_ = -1;
  nn::AttnLayerScratch scratch_;
  std::vector<float> dx_, dbuf_;  // (N, C) gradient of the residual stream; scratch
  std::vector<float> dbig_, dgu_;  // (N, F), (N, 2F)
  std::vector<float> dlogits_;     // (N, V)
};

}  // namespace diffattn
