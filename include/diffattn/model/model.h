// The Differential Transformer language model of docs/FORMAT.md ("diffattn/1"): its weights in
// one flat buffer laid out by the tensor table (or kept as loaded, WeightStore) and the const
// layer pieces its runners compose: a TrainContext (train_context.h: forward and backward over a
// batch) and an infer::Session (include/diffattn/infer/: inference). Its description: config.h;
// files: checkpoint.h and safetensors.h; training: optimizer.h; generation: infer/sampler.h.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "diffattn/base/dtype.h"
#include "diffattn/base/tensor.h"
#include "diffattn/kernels/attention.h"
#include "diffattn/model/config.h"
#include "diffattn/nn/attention_layer.h"
#include "diffattn/nn/backend.h"
#include "diffattn/nn/mamba.h"

namespace diffattn::model {

// A SambaY layer's weights (ModelConfig::arch == Arch::SambaY; docs/models/phi4flash.md): its
// two LayerNorms and MLP, and its mixer's weights by kind (mamba: Mamba and GMU; attn: the
// attention kinds, proj holding only the q rows for cross attention).
struct SambaYLayer {
  LayerKind kind = LayerKind::Mamba;
  const float *ln_in_w = nullptr, *ln_in_b = nullptr, *ln_post_w = nullptr, *ln_post_b = nullptr;
  TensorView fc1, fc2;  // (2F, C) rows [gate | up]; (C, F)
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

// A model's weights, the one representation every model reads them through: one typed view
// per tensor_table entry and whatever keeps the memory alive. Two kinds: kept as loaded (the
// loaders of arch.h: memory-mapped files, BF16 and F16 matrices in their stored type, the small
// vectors and permuted q/k/v blocks converted copies; read only, models built on one share it),
// and OwnedWeights (a trainable model's float32 buffer).
struct WeightStore {
  virtual ~WeightStore() = default;
  std::vector<TensorView> tensors;
  std::string description;  // what `diffattn info` shows, e.g. "Hugging Face diffllama, BF16"
};

// A trainable model's weights: one float32 buffer laid out by the tensor table (offsets,
// docs/FORMAT.md), each view pointing into it. A model built over one that it alone holds takes
// it as its own (init_weights and an optimizer step write it through Model::params); one shared
// with another holder is copied first, and copying a model copies it, so models never write
// each other's weights.
struct OwnedWeights final : WeightStore {
  // Zeros: a new model's; None: a loader's, which writes every value (no page is touched
  // twice).
  enum class Fill { Zeros, None };
  // A buffer for the table (InvalidArgument when it would not fit in memory).
  explicit OwnedWeights(const std::vector<TensorInfo>& table, Fill fill = Fill::Zeros);
  OwnedWeights(const OwnedWeights& o);  // a deep copy, its views into its own buffer
  OwnedWeights& operator=(const OwnedWeights&) = delete;
  // Every value, laid out by the table (TensorInfo::offset).
  std::span<float> values() { return {buf_.get(), n_}; }
  std::span<const float> values() const { return {buf_.get(), n_}; }

 private:
  std::unique_ptr<float[]> buf_;
  size_t n_ = 0;
};

// The weights and what reads them: immutable after load (init_weights and an optimizer step
// write a trainable model's params) and shared by const&. Run state lives with the runner: a
// TrainContext (train_context.h) for whole-batch forward and backward, an infer::Session
// (include/diffattn/infer/) for inference.
class Model {
 public:
  // A trainable model: float32 weights (zeros) in its own OwnedWeights.
  explicit Model(const ModelConfig& cfg);
  // A model over a store: trainable when the store is an OwnedWeights (taken as the model's own
  // when the model holds its only reference, else copied), an inference model over weights kept
  // as loaded otherwise (no params; TrainContext::backward refuses).
  Model(const ModelConfig& cfg, std::shared_ptr<const WeightStore> store);
  // Copies share a store kept as loaded and copy owned weights (the paired-init experiments
  // train copies of one initialisation).
  Model(const Model& o);
  Model& operator=(const Model& o);
  Model(Model&&) noexcept = default;
  Model& operator=(Model&&) noexcept = default;

  const ModelConfig& config() const { return cfg_; }
  // Whether the weights are the model's own float32 buffer (OwnedWeights).
  bool trainable() const { return owned_ != nullptr; }
  // A trainable model's weights: flat float32, laid out by tensors() (TensorInfo::offset);
  // throws InvalidArgument for a model over weights kept as loaded.
  std::span<float> params();
  std::span<const float> params() const;
  // Where the weights live: "float32" or the store's description.
  std::string storage() const;
  // A tensor in its stored type (a view with the table's shape, read only; to_dlpack exports it
  // without a copy), and a float32 copy of it.
  TensorView weight(const std::string& name) const;
  std::vector<float> weight_f32(const std::string& name) const;
  const std::vector<TensorInfo>& tensors() const { return table_; }
  const TensorInfo& tensor(const std::string& name) const;  // throws naming the tensor
  int64_t num_params() const;

  // Seeded initialisation: linear weights and embeddings N(0, 0.02), norms 1, V1 lambda
  // vectors N(0, 0.1) (the upstream code's convention). Same seed, same weights.
  void init_weights(uint64_t seed);

  // Per-layer lambda read from the weights: V1 the layer's scalar (Eq. 2); V2's is per token
  // (NaN here: TrainContext::layer_lambdas gives a forward's mean); standard: empty.
  std::vector<double> layer_lambdas() const;

  // ---- the layer pieces a runner composes (TrainContext, infer::Session) ----

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
  // One decoder layer over N rows, the body training and inference share: x_out = x_mid +
  // down(silu(gate f) * up f), f = rmsnorm(x_mid), x_mid = x_in + attn(rmsnorm(x_in)), where
  // attn is the caller's attention (the training forward's, a paged prompt chunk, a decode
  // step). a's buffers are resized (no allocation once large enough) and keep what the
  // backward reads. x_out may be x_in (inference updates the stream in place).
  // The products and norms run through ctx (the runner's backend, nn/backend.h).
  void layer(const nn::ExecContext& ctx, int64_t l, LayerActs& a, const float* x_in, float* x_out,
             int64_t N, const AttnFn& attn) const;
  // logits (N, V) of rows x (N, C): the final norm, then the output head; normed and rstd are
  // the caller's scratch.
  void head(const nn::ExecContext& ctx, float* logits, const float* x, int64_t N,
            std::vector<float>& normed, std::vector<float>& rstd) const;
  nn::AttnLayerWeights attn_weights(int64_t l) const;
  // Arch::SambaY: layer l's weights and the Mamba sizes (throws for another architecture).
  const SambaYLayer& sambay_layer(int64_t l) const;
  nn::MambaShape mamba_shape() const;
  // RoPE's frequencies (D/2), scaled per config().rope_scaling (nn::rope_table's inv_freq).
  const std::vector<double>& rope_inv_freq() const { return inv_freq_; }

 private:
  friend class TrainContext;  // the backward reads the tensor offsets (off, lt_)
  // The FFN half of layer over N rows: from a.x_mid to x_out.
  void ffn_fwd(const nn::ExecContext& ctx, int64_t l, LayerActs& a, float* x_out, int64_t N) const;
  void require_trainable(const char* what) const;
  // Tensor i of the table: in its stored type, as float32 (throws if stored otherwise), and
  // its offset in params (trainable models) and in a context's gradients.
  TensorView wt(int64_t i) const;
  const float* wf(int64_t i) const { return i < 0 ? nullptr : wt(i).f32(); }
  int64_t off(int64_t i) const { return table_[static_cast<size_t>(i)].offset; }
  void index_tensors();  // from table_ and store_: the per-layer indices and derived arrays
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
  std::shared_ptr<const WeightStore> store_;  // never null
  std::shared_ptr<OwnedWeights> owned_;       // store_ itself when trainable, else null
  std::vector<double> inv_freq_;  // RoPE frequencies (D/2), scaled per cfg_.rope_scaling
};

// Throws InvalidArgument (naming `what`, the backend and the op) unless ctx's backend runs every
// op m's layer bodies need: its products for each weight type it stores, the norms, RoPE,
// SwiGLU, and attention: paged over K/V of kv_dtype (an inference session; SambaY's windows also
// the plain forward on kv_dtype), else the whole-batch forward (a TrainContext, whose backward
// checks attention_backward when it runs). Runners call it once, when they are made.
void require_backend(const Model& m, const nn::ExecContext& ctx, bool paged, DType kv_dtype,
                     const char* what);

}  // namespace diffattn::model
