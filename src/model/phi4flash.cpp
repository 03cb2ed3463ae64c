// Phi-4-mini-flash (model_type "phi4flash", the SambaY hybrid; docs/models/phi4flash.md): the
// model's per-layer weights from its tensor table (config.cpp lists the tensors under their
// published names, arch_phi4flash.cpp translates its config.json, hf_reader.cpp maps the files), and the float32 forms the kernels read.
// The layer bodies run in infer/sambay.cpp over nn/mamba.h and nn/attention_layer.h.
#include <cmath>
#include <string>

#include "diffattn/base/error.h"
#include "diffattn/model/model.h"

namespace diffattn::model {

void Model::index_sambay() {
  auto at = [&](const std::string& n) -> int64_t {
    auto it = index_.find(n);
    if (it == index_.end()) throw InvalidArgument("model: SambaY tensor \"" + n + "\" missing from the table");
    return static_cast<int64_t>(it->second);
  };
  const nn::MambaShape ms = mamba_shape();
  auto derived = std::make_shared<std::vector<std::vector<float>>>();
  sambay_.clear();
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".", a = p + "attn.";
    SambaYLayer y;
    y.kind = cfg_.layer_kind(l);
    y.ln_in_w = wf(at(p + "input_layernorm.weight"));
    y.ln_in_b = wf(at(p + "input_layernorm.bias"));
    y.ln_post_w = wf(at(p + "post_attention_layernorm.weight"));
    y.ln_post_b = wf(at(p + "post_attention_layernorm.bias"));
    y.fc1 = wt(at(p + "mlp.fc1.weight"));
    y.fc2 = wt(at(p + "mlp.fc2.weight"));
    if (y.kind == LayerKind::Mamba || y.kind == LayerKind::Gmu) {
      y.mamba.in_proj = wt(at(a + "in_proj.weight"));
      y.mamba.out_proj = wt(at(a + "out_proj.weight"));
    }
    if (y.kind == LayerKind::Mamba) {
      y.mamba.x_proj = wt(at(a + "x_proj.weight"));
      y.mamba.dt_proj = wt(at(a + "dt_proj.weight"));
      y.mamba.conv_b = wf(at(a + "conv1d.bias"));
      y.mamba.dt_bias = wf(at(a + "dt_proj.bias"));
      y.mamba.D = wf(at(a + "D"));
      // conv1d.weight (E, 1, K) -> taps (K, E); A = -exp(A_log) (E, N), both once, float32
      const int64_t E = ms.E, K = ms.K, N = ms.N;
      const float* cw = wf(at(a + "conv1d.weight"));
      std::vector<float> taps(static_cast<size_t>(K * E));
      for (int64_t e = 0; e < E; ++e) {
        for (int64_t k = 0; k < K; ++k) taps[static_cast<size_t>(k * E + e)] = cw[e * K + k];
      }
      const float* alog = wf(at(a + "A_log"));
      std::vector<float> A(static_cast<size_t>(E * N));
      for (int64_t i = 0; i < E * N; ++i) A[static_cast<size_t>(i)] = -std::exp(alog[i]);
      derived->push_back(std::move(taps));
      y.mamba.conv_w = derived->back().data();
      derived->push_back(std::move(A));
      y.mamba.A = derived->back().data();
    } else if (y.kind != LayerKind::Gmu) {
      const std::string c = a + "inner_cross_attn.";
      y.attn.proj = wt(at(a + "Wqkv.weight"));
      y.attn.proj_bias = wf(at(a + "Wqkv.bias"));
      y.attn.out_proj = wt(at(a + "out_proj.weight"));
      y.attn.out_bias = wf(at(a + "out_proj.bias"));
      y.attn.lambda_q1 = wf(at(c + "lambda_q1"));
      y.attn.lambda_k1 = wf(at(c + "lambda_k1"));
      y.attn.lambda_q2 = wf(at(c + "lambda_q2"));
      y.attn.lambda_k2 = wf(at(c + "lambda_k2"));
      y.attn.subln = wf(at(c + "subln.weight"));
    }
    sambay_.push_back(y);
  }
  derived_ = std::move(derived);  // moving vectors of the outer vector keeps their buffers
}

const SambaYLayer& Model::sambay_layer(int64_t l) const {
  if (cfg_.arch != Arch::SambaY || l < 0 || l >= static_cast<int64_t>(sambay_.size())) {
    throw InvalidArgument("model: no SambaY layer " + std::to_string(l));
  }
  return sambay_[static_cast<size_t>(l)];
}

nn::MambaShape Model::mamba_shape() const {
  nn::MambaShape s;
  s.C = cfg_.d_model;
  s.E = cfg_.mamba_inner();
  s.N = cfg_.sambay.d_state;
  s.K = cfg_.sambay.d_conv;
  s.R = cfg_.sambay.dt_rank;
  return s;
}

}  // namespace diffattn::model
