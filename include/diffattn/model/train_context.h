// A model's run state for whole-batch forward and backward (docs/FORMAT.md, "The computation"):
// the activations the backward reads, the logits, the loss's statistics and the gradients.
// Training (train::Trainer), evaluation and looking inside (eval/inspect.h, the explorer) each
// bring their own; the model is read only here, so any number of contexts (and inference
// sessions, include/diffattn/infer/) share one const Model. The optimizer (optimizer.h) is the
// one writer of a trainable model's weights, from a context's gradients.
#pragma once

#include <cstdint>
#include <vector>

#include "diffattn/kernels/attention.h"
#include "diffattn/model/model.h"
#include "diffattn/nn/attention_layer.h"
#include "diffattn/nn/backend.h"

namespace diffattn::model {

class TrainContext {
 public:
  // The model must outlive the context. Nothing is allocated before the first forward. The
  // forward's products, norms, RoPE, SwiGLU and attention, and the attention backward, run
  // through ctx (nn/backend.h; checked here: InvalidArgument naming the op it lacks); the dense
  // layers' backward runs on the host.
  explicit TrainContext(const Model& m, const nn::ExecContext& ctx = nn::cpu_context());
  const Model& model() const { return *m_; }

  // Forward over tokens (B, T). With targets (B, T) returns the mean cross-entropy over the
  // positions whose target is >= 0; without, 0. Logits stay in logits() (B, T, V).
  double forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T);
  // After forward with targets: grads() += d(dloss_scale * mean loss)/dparams (a trainable
  // model's; refused for one over a WeightStore).
  void backward(float dloss_scale = 1.0f);
  void zero_grads();
  const std::vector<float>& logits() const { return logits_; }
  // Laid out like Model::params (tensors()); empty before zero_grads or backward.
  const std::vector<float>& grads() const { return grads_; }

  // Model::layer_lambdas with V2's filled in: the mean of sigmoid(lambda_proj x) over the last
  // forward's tokens and heads (NaN before any forward).
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

 private:
  nn::AttnLayerGrads attn_grads(int64_t l);
  void rope_for(int64_t pos0, int64_t T);

  const Model* m_;
  nn::ExecContext ctx_;
  int64_t B_ = 0, T_ = 0;
  std::vector<int32_t> tokens_, targets_;
  std::vector<Model::LayerActs> acts_;
  std::vector<float> x_final_, nf_;            // (N, C) the last layer's output, rmsnorm(., norm)
  std::vector<float> nf_rstd_, lse_, losses_;  // (N)
  std::vector<float> logits_;                  // (N, V)
  int64_t counted_ = 0;
  std::vector<float> cos_, sin_;
  int64_t rope_pos0_ = -1, rope_T_ = -1;
  nn::AttnLayerScratch scratch_;
  std::vector<float> grads_;       // laid out like Model::params
  std::vector<float> dx_, dbuf_;   // (N, C) gradient of the residual stream; scratch
  std::vector<float> dbig_, dgu_;  // (N, F), (N, 2F)
  std::vector<float> dlogits_;     // (N, V)
};

}  // namespace diffattn::model
