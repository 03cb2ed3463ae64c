// Session::decode for a recurrent model: Phi-4-mini-flash's SambaY hybrid
// (docs/models/phi4flash.md). Per sequence the KvStore keeps the Mamba layers' conv and scan
// states, a ring of W positions per sliding-window layer and, in its blocks of the one pool,
// the full-attention layer's keys and values (YOCO), which every cross-attention layer reads.
// The self-decoder (layers up to the full-attention one) runs every row; the cross-decoder only
// the rows whose logits are wanted: it has no state of its own, so a prompt
// chunk whose logits nobody wants stops there, and one that wants its last row's runs one row
// (arXiv:2507.06607; vLLM's V0 port does the same).
#include <algorithm>
#include <cstring>
#include <string>

#include "diffattn/base/error.h"
#include "diffattn/infer/session.h"
#include "diffattn/nn/layers.h"
#include "diffattn/nn/mamba.h"

namespace diffattn::infer {

namespace {

void add_into(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

// Layer l's place among the Mamba layers (even l up to L/2) or the sliding-window layers (odd
// l below L/2): both l / 2.
int64_t state_index(int64_t l) { return l / 2; }

}  // namespace

void Session::sambay_layers(int64_t l0, int64_t l1, int64_t N, const std::vector<nn::MambaSeq>* mseqs,
                            const std::function<void(int64_t, float*, const float*)>& mixer) {
  const model::ModelConfig& cfg = m_.config();
  const int64_t C = cfg.d_model, F = cfg.ffn_dim;
  const nn::MambaShape ms = m_.mamba_shape();
  ln_.resize(static_cast<size_t>(N * C));
  mix_.resize(static_cast<size_t>(N * C));
  fc_.resize(static_cast<size_t>(N * 2 * F));
  hid_.resize(static_cast<size_t>(N * F));
  std::vector<nn::MambaSeq>& at_layer = mseqs_at_;
  for (int64_t l = l0; l < l1; ++l) {
    const model::SambaYLayer& y = m_.sambay_layer(l);
    ctx_.layernorm(ln_.data(), x_.data(), y.ln_in_w, y.ln_in_b, N, C, cfg.norm_eps);
    if (y.kind == model::LayerKind::Mamba) {
      // each sequence's state of this layer
      at_layer = *mseqs;
      const int64_t i = state_index(l);
      for (nn::MambaSeq& q : at_layer) {
        q.conv += i * (ms.K - 1) * ms.E;
        q.ssm += i * ms.E * ms.N;
      }
      float* mem = nullptr;
      if (l == cfg.memory_layer()) {
        mem_.resize(static_cast<size_t>(N * ms.E));
        mem = mem_.data();
      }
      nn::mamba_fwd(mix_.data(), mamba_, ln_.data(), y.mamba, ms, N, at_layer, mem);
    } else if (y.kind == model::LayerKind::Gmu) {
      nn::gmu_fwd(mix_.data(), mamba_, ln_.data(), mem_.data(), y.mamba, ms, N);
    } else {
      mixer(l, mix_.data(), ln_.data());
    }
    add_into(x_.data(), mix_.data(), N * C);
    ctx_.layernorm(ln_.data(), x_.data(), y.ln_post_w, y.ln_post_b, N, C, cfg.norm_eps);
    ctx_.linear(fc_.data(), ln_.data(), y.fc1, N, C, 2 * F);
    ctx_.swiglu(hid_.data(), fc_.data(), fc_.data() + F, N, F, 2 * F);
    ctx_.linear(mix_.data(), hid_.data(), y.fc2, N, F, C);
    add_into(x_.data(), mix_.data(), N * C);
  }
}

void Session::sambay_chunk(const Batch& b, const std::vector<int64_t>& rows,
                           const std::vector<int64_t>& out_row, float* logits) {
  const model::ModelConfig& cfg = m_.config();
  const int64_t T = static_cast<int64_t>(rows.size()), C = cfg.d_model;
  const size_t first = static_cast<size_t>(rows[0]);
  const int64_t pos0 = b.pos[first];
  KvStore::Seq& s = kv_.seq(b.seq_id[first]);
  toks_.resize(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) toks_[static_cast<size_t>(t)] = b.tokens[static_cast<size_t>(rows[static_cast<size_t>(t)])];
  x_.resize(static_cast<size_t>(T * C));
  m_.embed(x_.data(), toks_.data(), T);
  const std::vector<nn::MambaSeq> mseqs{{0, T, s.rec.conv.data(), s.rec.ssm.data()}};
  const int64_t yoco = cfg.yoco_layer();
  // The self-decoder over every row: the windows from each layer's ring, the full-attention
  // layer's K/V into the sequence's blocks.
  sambay_layers(0, yoco + 1, T, &mseqs, [&](int64_t l, float* out, const float* an) {
    const model::SambaYLayer& y = m_.sambay_layer(l);
    if (y.kind == model::LayerKind::SlidingAttention) {
      const std::vector<nn::WindowSeq> w{{0, T, pos0, &s.rec.rings[static_cast<size_t>(state_index(l))]}};
      nn::attn_layer_window(ctx_, out, layer_.attn, an, y.attn, cfg.attn_shape(l), T, w, window_);
    } else {
      nn::attn_layer_fwd_paged(ctx_, out, layer_.attn, an, y.attn, cfg.attn_shape(l), T, nullptr,
                               nullptr, kv_.pools()[0], s.table.data(),
                               static_cast<int64_t>(s.table.size()), pos0);
    }
  });
  s.len = pos0 + T;
  // The cross-decoder: the rows whose logits are wanted (all, or just the last).
  int64_t wanted = 0;
  for (const int64_t r : rows) wanted += out_row[static_cast<size_t>(r)] >= 0;
  if (wanted == 0) return;
  std::vector<int64_t> run = rows;
  int64_t N = T;
  if (wanted == 1 && out_row[static_cast<size_t>(rows.back())] >= 0 && T > 1) {
    const int64_t E = cfg.mamba_inner();
    std::memmove(x_.data(), x_.data() + (T - 1) * C, sizeof(float) * static_cast<size_t>(C));
    std::memmove(mem_.data(), mem_.data() + (T - 1) * E, sizeof(float) * static_cast<size_t>(E));
    run.assign(1, rows.back());
    N = 1;
  }
  // The full-attention layer's keys (pos0 + T), read in the sequence's blocks.
  sambay_layers(yoco + 1, cfg.n_layers, N, nullptr, [&](int64_t l, float* out, const float* an) {
    nn::attn_layer_cross_fwd_paged(ctx_, out, layer_.attn, an, m_.sambay_layer(l).attn, cfg.attn_shape(l),
                                   N, kv_.pools()[0], s.table.data(),
                                   static_cast<int64_t>(s.table.size()), pos0 + T);
  });
  logits_of(x_.data(), N, run, out_row, logits);
}

void Session::sambay_rows(const Batch& b, const std::vector<int64_t>& rows,
                          const std::vector<int64_t>& out_row, float* logits) {
  const model::ModelConfig& cfg = m_.config();
  const int64_t B = static_cast<int64_t>(rows.size()), C = cfg.d_model;
  toks_.resize(static_cast<size_t>(B));
  int64_t stride = 1;
  for (const int64_t i : rows) {
    stride = std::max<int64_t>(stride, static_cast<int64_t>(kv_.seq(b.seq_id[static_cast<size_t>(i)]).table.size()));
  }
  tables_.assign(static_cast<size_t>(B * stride), -1);
  lens_.resize(static_cast<size_t>(B));
  std::vector<nn::MambaSeq>& mseqs = mseqs_;
  std::vector<KvStore::Seq*>& seqs = seqs_;
  mseqs.clear();
  seqs.clear();
  for (int64_t r = 0; r < B; ++r) {
    const size_t i = static_cast<size_t>(rows[static_cast<size_t>(r)]);
    KvStore::Seq& s = kv_.seq(b.seq_id[i]);
    toks_[static_cast<size_t>(r)] = b.tokens[i];
    std::copy(s.table.begin(), s.table.end(), tables_.begin() + r * stride);
    lens_[static_cast<size_t>(r)] = b.pos[i] + 1;
    mseqs.push_back({r, 1, s.rec.conv.data(), s.rec.ssm.data()});
    seqs.push_back(&s);
  }
  x_.resize(static_cast<size_t>(B * C));
  m_.embed(x_.data(), toks_.data(), B);
  const nn::PagedSeqs paged{B, tables_.data(), stride, lens_.data()};
  std::vector<nn::WindowSeq>& w = wseqs_;
  w.resize(static_cast<size_t>(B));
  sambay_layers(0, cfg.n_layers, B, &mseqs, [&](int64_t l, float* out, const float* an) {
    const model::SambaYLayer& y = m_.sambay_layer(l);
    const nn::AttnLayerShape shape = cfg.attn_shape(l);
    if (y.kind == model::LayerKind::SlidingAttention) {
      for (int64_t r = 0; r < B; ++r) {
        w[static_cast<size_t>(r)] = {r, 1, lens_[static_cast<size_t>(r)] - 1,
                                     &seqs[static_cast<size_t>(r)]->rec.rings[static_cast<size_t>(state_index(l))]};
      }
      nn::attn_layer_window(ctx_, out, layer_.attn, an, y.attn, shape, B, w, window_);
    } else if (y.kind == model::LayerKind::FullAttention) {
      nn::attn_layer_decode_paged(ctx_, out, layer_.attn, an, y.attn, shape, nullptr, nullptr,
                                  kv_.pools()[0], paged);
    } else {
      nn::attn_layer_cross_decode_paged(ctx_, out, layer_.attn, an, y.attn, shape, kv_.pools()[0], paged);
    }
  });
  for (int64_t r = 0; r < B; ++r) seqs[static_cast<size_t>(r)]->len = lens_[static_cast<size_t>(r)];
  logits_of(x_.data(), B, rows, out_row, logits);
}

}  // namespace diffattn::infer
