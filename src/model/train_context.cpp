// The forward and backward over a batch (docs/FORMAT.md, "The computation") with the run state
// in the context: activations are kept per layer for the backward; every gradient accumulates
// (+=) into the context's grads. The model is read only.
#include "diffattn/model/train_context.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "diffattn/base/memory.h"
#include "diffattn/model/config.h"
#include "diffattn/nn/layers.h"

namespace diffattn::model {

TrainContext::TrainContext(const Model& m, const nn::ExecContext& ctx) : m_(&m), ctx_(ctx) {
  require_backend(m, ctx_, /*paged=*/false, DType::F32, "TrainContext");
}

nn::AttnLayerGrads TrainContext::attn_grads(int64_t l) {
  const Model& m = *m_;
  const LayerTensors& o = m.lt_[static_cast<size_t>(l)];
  float* G = grads_.data();
  nn::AttnLayerGrads g;
  g.proj = G + m.off(o.proj);
  g.out_proj = G + m.off(o.out_proj);
  if (m.cfg_.attention == nn::AttnKind::DiffV1) {
    g.lambda_q1 = G + m.off(o.lambda_q1);
    g.lambda_k1 = G + m.off(o.lambda_k1);
    g.lambda_q2 = G + m.off(o.lambda_q2);
    g.lambda_k2 = G + m.off(o.lambda_k2);
    g.subln = G + m.off(o.subln);
  }
  return g;
}

void TrainContext::rope_for(int64_t pos0, int64_t T) {
  if (pos0 == rope_pos0_ && T == rope_T_) return;
  const ModelConfig& cfg = m_->config();
  const int64_t half = cfg.head_dim / 2;
  cos_.resize(static_cast<size_t>(T * half));
  sin_.resize(static_cast<size_t>(T * half));
  nn::rope_table(cos_.data(), sin_.data(), pos0, T, cfg.head_dim, m_->rope_inv_freq());
  rope_pos0_ = pos0;
  rope_T_ = T;
}

void TrainContext::zero_grads() {
  if (!m_->trainable()) return;  // no gradients (backward refuses, naming why)
  const size_t n = m_->params().size();
  if (grads_.size() != n) {
    check_fits_in_memory(4.0 * static_cast<double>(n),
                         "the gradients of a model of " + std::to_string(n) + " parameters");
    grads_.assign(n, 0.0f);
  } else {
    std::fill(grads_.begin(), grads_.end(), 0.0f);
  }
}

double TrainContext::forward(const int32_t* tokens, const int32_t* targets, int64_t B,
                             int64_t T) {
  const Model& m = *m_;
  const ModelConfig& cfg = m.config();
  if (cfg.recurrent()) {
    throw InvalidArgument("a phi4flash (SambaY) model is inference only (no loss, gradients or "
                          "training): it runs through an inference session (generate, serve; "
                          "Model.forward and Model.generate in Python)");
  }
  if (B < 1 || T < 1) {
    throw InvalidArgument("forward: tokens must be (B, T) with B, T >= 1, got (" +
                          std::to_string(B) + ", " + std::to_string(T) + ")");
  }
  if (T > cfg.max_seq_len) {
    throw InvalidArgument("forward: tokens have T = " + std::to_string(T) +
                          " positions, more than max_seq_len = " +
                          std::to_string(cfg.max_seq_len));
  }
  const int64_t C = cfg.d_model, V = cfg.vocab_size, BT = B * T;
  B_ = B;
  T_ = T;
  tokens_.assign(tokens, tokens + BT);
  if (targets) {
    targets_.assign(targets, targets + BT);
  } else {
    targets_.clear();
  }
  rope_for(0, T);
  acts_.resize(static_cast<size_t>(cfg.n_layers));

  // The residual stream: layer l reads x_in, writes x_mid = x_in + attn and the next layer's
  // x_in (x_final_ after the last) = x_mid + ffn; each is kept for the backward.
  const size_t nx = static_cast<size_t>(BT * C);
  acts_[0].x_in.resize(nx);
  x_final_.resize(nx);
  m.embed(acts_[0].x_in.data(), tokens, BT);
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    Model::LayerActs& a = acts_[static_cast<size_t>(l)];
    std::vector<float>& next =
        l + 1 < cfg.n_layers ? acts_[static_cast<size_t>(l + 1)].x_in : x_final_;
    next.resize(nx);
    const nn::AttnLayerWeights w = m.attn_weights(l);
    const nn::AttnLayerShape shape = cfg.attn_shape(l);
    m.layer(ctx_, l, a, a.x_in.data(), next.data(), BT, [&](float* out, const float* an) {
      nn::attn_layer_fwd(ctx_, out, a.attn, an, w, shape, B, T, cos_.data(), sin_.data(), true);
    });
  }
  nf_.resize(x_final_.size());
  nf_rstd_.resize(static_cast<size_t>(BT));
  ctx_.rmsnorm(nf_.data(), nf_rstd_.data(), x_final_.data(), m.wf(m.norm_), BT, C,
                  cfg.norm_eps);
  logits_.resize(static_cast<size_t>(BT * V));
  ctx_.linear(logits_.data(), nf_.data(), m.wt(m.head_), BT, C, V);
  if (!targets) return 0.0;
  lse_.resize(static_cast<size_t>(BT));
  losses_.resize(static_cast<size_t>(BT));
  nn::cross_entropy_fwd(losses_.data(), lse_.data(), logits_.data(), targets, BT, V);
  double sum = 0;
  counted_ = 0;
  for (int64_t i = 0; i < BT; ++i) {
    if (targets[i] >= 0) {
      sum += losses_[static_cast<size_t>(i)];
      ++counted_;
    }
  }
  return counted_ ? sum / static_cast<double>(counted_) : 0.0;
}

void TrainContext::backward(float dloss_scale) {
  const Model& m = *m_;
  const ModelConfig& cfg = m.config();
  m.require_trainable("backward");
  for (nn::Op op : {nn::Op::AttentionBackward, nn::Op::LinearBackward, nn::Op::RmsNormBackward,
                    nn::Op::SwiGluBackward, nn::Op::Rope}) {
    ctx_.require(op, DType::F32, "backward");
  }
  if (cfg.attn_bias || cfg.mlp_bias) {
    throw InvalidArgument("backward: this model has projection biases (attention_bias / mlp_bias), which diffattn runs for inference only; training one is refused");
  }
  if (cfg.mlp != MlpKind::SwiGLU || cfg.noise_share != 1) {
    throw InvalidArgument(std::string("backward: ") +
                          (cfg.mlp != MlpKind::SwiGLU ? "the PolyNorm MLP" : "shared noise heads (noise_share)") +
                          " runs for inference only; training this model is refused");
  }
  if (targets_.empty()) throw InvalidArgument("backward: the last forward had no targets");
  const std::span<const float> weights = m.params();
  const float* P = weights.data();
  if (grads_.size() != weights.size()) zero_grads();
  const int64_t B = B_, T = T_, C = cfg.d_model, F = cfg.ffn_dim, V = cfg.vocab_size;
  const int64_t BT = B * T;
  float* Gr = grads_.data();
  dlogits_.resize(logits_.size());
  const float dloss = counted_ ? dloss_scale / static_cast<float>(counted_) : 0.0f;
  nn::cross_entropy_bwd(dlogits_.data(), logits_.data(), lse_.data(), targets_.data(), dloss, BT,
                        V);
  // logits = lm_head(nf)
  dbuf_.resize(static_cast<size_t>(BT * C));
  ctx_.linear_backward(dbuf_.data(), Gr + m.off(m.head_), dlogits_.data(), nf_.data(),
                 P + m.off(m.head_), BT, C, V, 0, true);
  // nf = rmsnorm(x, norm)
  dx_.assign(static_cast<size_t>(BT * C), 0.0f);
  ctx_.rmsnorm_backward(dx_.data(), Gr + m.off(m.norm_), dbuf_.data(), x_final_.data(),
                  P + m.off(m.norm_), nf_rstd_.data(), BT, C);
  for (int64_t l = cfg.n_layers - 1; l >= 0; --l) {
    Model::LayerActs& a = acts_[static_cast<size_t>(l)];
    const LayerTensors& lt = m.lt_[static_cast<size_t>(l)];
    struct {
      int64_t down, gate_up, ffn_norm, attn_norm;
    } o{m.off(lt.down), m.off(lt.gate), m.off(lt.ffn_norm), m.off(lt.attn_norm)};
    // x_out = x_mid + down(h): dx flows through unchanged, plus the branch
    dbig_.resize(static_cast<size_t>(BT * F));
    ctx_.linear_backward(dbig_.data(), Gr + o.down, dx_.data(), a.h.data(), P + o.down, BT, F, C, 0,
                   true);
    dgu_.assign(static_cast<size_t>(BT * 2 * F), 0.0f);
    ctx_.swiglu_backward(dgu_.data(), dgu_.data() + F, dbig_.data(), a.gu.data(), a.gu.data() + F, BT,
                   F, 2 * F);
    ctx_.linear_backward(dbuf_.data(), Gr + o.gate_up, dgu_.data(), a.fn.data(), P + o.gate_up, BT, C,
                   2 * F, 0, true);
    ctx_.rmsnorm_backward(dx_.data(), Gr + o.ffn_norm, dbuf_.data(), a.x_mid.data(), P + o.ffn_norm,
                    a.fn_rstd.data(), BT, C);
    // x_mid = x_in + attn(an)
    dbuf_.assign(static_cast<size_t>(BT * C), 0.0f);
    nn::attn_layer_bwd(ctx_, dbuf_.data(), attn_grads(l), dx_.data(), a.attn, a.an.data(),
                       m.attn_weights(l), cfg.attn_shape(l), B, T, cos_.data(), sin_.data(),
                       scratch_);
    ctx_.rmsnorm_backward(dx_.data(), Gr + o.attn_norm, dbuf_.data(), a.x_in.data(), P + o.attn_norm,
                    a.an_rstd.data(), BT, C);
  }
  nn::embedding_bwd(Gr + m.off(m.embed_), dx_.data(), tokens_.data(), BT, C);
}

std::vector<double> TrainContext::layer_lambdas() const {
  std::vector<double> out = m_->layer_lambdas();
  if (m_->config().attention != nn::AttnKind::DiffV2 || m_->config().recurrent()) return out;
  for (size_t l = 0; l < out.size() && l < acts_.size(); ++l) {
    const std::vector<float>& lam = acts_[l].attn.lam;
    if (lam.empty()) continue;
    double s = 0;
    for (float x : lam) s += x;
    out[l] = s / static_cast<double>(lam.size());
  }
  return out;
}

TrainContext::LayerAttention TrainContext::layer_attention(int64_t layer) const {
  const ModelConfig& cfg = m_->config();
  if (layer < 0 || layer >= cfg.n_layers) {
    throw InvalidArgument("layer_attention: layer " + std::to_string(layer) + " is outside [0, " +
                          std::to_string(cfg.n_layers) + ")");
  }
  if (B_ == 0) throw InvalidArgument("layer_attention: run forward() first");
  LayerAttention a;
  a.shape = cfg.attn_shape(layer);
  a.params = nn::attn_layer_params(acts_[static_cast<size_t>(layer)].attn, a.shape, B_, T_);
  return a;
}

}  // namespace diffattn::model
