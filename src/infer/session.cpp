// Session::decode (session.h): a batch's rows grouped by sequence, the one-row sequences as one
// batched decode step, the prompt chunks one sequence at a time, logits for the rows that want
// them.
#include "diffattn/infer/session.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "diffattn/base/error.h"
#include "diffattn/nn/layers.h"

namespace diffattn::infer {

Session::Session(const model::Model& m, KvStore& kv, const nn::ExecContext& ctx)
    : m_(m), ctx_(ctx), kv_(kv) {
  model::require_backend(m, ctx_, /*paged=*/true, kv.kv_dtype(), "Session");
  if (kv.n_layers() != KvStore::kv_layers(m.config())) {
    throw InvalidArgument("Session: a KV store of " + std::to_string(kv.n_layers()) +
                          " layers for a model with K/V in " +
                          std::to_string(KvStore::kv_layers(m.config())));
  }
}

void Session::decode(const Batch& b, float* logits) {
  const int64_t n = b.size(), V = m_.config().vocab_size, cap = m_.config().max_seq_len;
  if (n < 1) throw InvalidArgument("Session::decode: the batch has no rows");
  if (static_cast<int64_t>(b.pos.size()) != n || static_cast<int64_t>(b.seq_id.size()) != n ||
      static_cast<int64_t>(b.logits.size()) != n) {
    throw InvalidArgument("Session::decode: the batch's tokens, pos, seq_id and logits differ in length");
  }
  // Rows by sequence, sequences in the order they first appear; each row's logits row.
  std::vector<int32_t> order;
  std::vector<std::vector<int64_t>> rows_of;
  std::vector<int64_t> out_row(static_cast<size_t>(n), -1);
  int64_t n_out = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t id = b.seq_id[static_cast<size_t>(i)];
    const auto at = std::find(order.begin(), order.end(), id);
    if (at == order.end()) {
      order.push_back(id);
      rows_of.emplace_back(1, i);
    } else {
      rows_of[static_cast<size_t>(at - order.begin())].push_back(i);
    }
    if (b.logits[static_cast<size_t>(i)]) out_row[static_cast<size_t>(i)] = n_out++;
  }
  // Everything is checked before anything runs: a refused batch changes nothing.
  for (size_t k = 0; k < order.size(); ++k) {
    const KvStore::Seq& s = kv_.seq(order[k]);  // throws for a sequence not open
    const std::vector<int64_t>& rows = rows_of[k];
    for (size_t j = 0; j < rows.size(); ++j) {
      const size_t i = static_cast<size_t>(rows[j]);
      const int64_t want = s.len + static_cast<int64_t>(j);
      if (b.pos[i] != want) {
        throw InvalidArgument("Session::decode: row " + std::to_string(i) + " of sequence " +
                              std::to_string(order[k]) + " is at position " +
                              std::to_string(b.pos[i]) + ", not " + std::to_string(want) +
                              " (a sequence's rows continue it, in order)");
      }
      if (b.tokens[i] < 0 || b.tokens[i] >= V) {
        throw InvalidArgument("Session::decode: token " + std::to_string(b.tokens[i]) +
                              " is outside the vocabulary (0.." + std::to_string(V - 1) + ")");
      }
    }
    const int64_t end = s.len + static_cast<int64_t>(rows.size());
    const int64_t used = (end + kv_.block_size() - 1) / kv_.block_size();
    for (int64_t j = 0; j < std::min<int64_t>(used, static_cast<int64_t>(s.table.size())); ++j) {
      const int32_t blk = s.table[static_cast<size_t>(j)];
      const int64_t total = kv_.pools()[0].n_blocks;
      if (blk < 0 || blk >= total) {
        throw InvalidArgument("Session::decode: sequence " + std::to_string(order[k]) + "'s block " +
                              std::to_string(blk) + " is outside the pool of " +
                              std::to_string(total));
      }
    }
    if (end > cap) {
      throw InvalidArgument("Session::decode: sequence " + std::to_string(order[k]) + " would hold " +
                            std::to_string(end) + " positions, beyond the model's context of " +
                            std::to_string(cap));
    }
    if (end > kv_.capacity(order[k])) {
      throw InvalidArgument("Session::decode: sequence " + std::to_string(order[k]) + " would hold " +
                            std::to_string(end) + " positions, more than its " +
                            std::to_string(kv_.capacity(order[k])) + " (" +
                            (kv_.contiguous() ? std::string("the contiguous cache's capacity")
                                              : std::to_string(s.table.size()) + " blocks of " +
                                                    std::to_string(kv_.block_size())) + ")");
    }
  }
  const bool rec = m_.config().recurrent();
  std::vector<int64_t> singles;
  for (size_t k = 0; k < order.size(); ++k) {
    if (rows_of[k].size() == 1) singles.push_back(rows_of[k][0]);
  }
  if (!singles.empty()) {
    if (rec) {
      sambay_rows(b, singles, out_row, logits);
    } else {
      decode_rows(b, singles, out_row, logits);
    }
  }
  for (size_t k = 0; k < order.size(); ++k) {
    if (rows_of[k].size() <= 1) continue;
    if (rec) {
      sambay_chunk(b, rows_of[k], out_row, logits);
    } else {
      decode_chunk(b, rows_of[k], out_row, logits);
    }
  }
}

void Session::decode_rows(const Batch& b, const std::vector<int64_t>& rows,
                          const std::vector<int64_t>& out_row, float* logits) {
  const model::ModelConfig& cfg = m_.config();
  const int64_t B = static_cast<int64_t>(rows.size()), C = cfg.d_model;
  const size_t half = static_cast<size_t>(cfg.head_dim / 2);
  // Each sequence's RoPE angles at its own new position: cos/sin (B, D/2); its table and the
  // positions it holds after this step.
  cos_.resize(static_cast<size_t>(B) * half);
  sin_.resize(cos_.size());
  toks_.resize(static_cast<size_t>(B));
  int64_t stride = 1;
  for (const int64_t i : rows) {
    stride = std::max<int64_t>(stride, static_cast<int64_t>(kv_.seq(b.seq_id[static_cast<size_t>(i)]).table.size()));
  }
  tables_.assign(static_cast<size_t>(B * stride), -1);  // entries past a table: never read
  lens_.resize(static_cast<size_t>(B));
  for (int64_t r = 0; r < B; ++r) {
    const size_t i = static_cast<size_t>(rows[static_cast<size_t>(r)]);
    const KvStore::Seq& s = kv_.seq(b.seq_id[i]);
    nn::rope_table(&cos_[static_cast<size_t>(r) * half], &sin_[static_cast<size_t>(r) * half],
                   b.pos[i], 1, cfg.head_dim, m_.rope_inv_freq());
    toks_[static_cast<size_t>(r)] = b.tokens[i];
    std::copy(s.table.begin(), s.table.end(), tables_.begin() + r * stride);
    lens_[static_cast<size_t>(r)] = b.pos[i] + 1;
  }
  x_.resize(static_cast<size_t>(B * C));
  m_.embed(x_.data(), toks_.data(), B);
  const nn::PagedSeqs seqs{B, tables_.data(), stride, lens_.data()};
  std::vector<nn::KVPool>& pools = kv_.pools();
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    // The norm, projections and FFN over the B rows; RoPE and the K/V append per sequence,
    // one paged decode call over all of them.
    m_.layer(ctx_, l, layer_, x_.data(), x_.data(), B, [&](float* out, const float* an) {
      nn::attn_layer_decode_paged(ctx_, out, layer_.attn, an, m_.attn_weights(l), cfg.attn_shape(l),
                                  cos_.data(), sin_.data(), pools[static_cast<size_t>(l)], seqs);
    });
  }
  for (int64_t r = 0; r < B; ++r) {
    const size_t i = static_cast<size_t>(rows[static_cast<size_t>(r)]);
    kv_.seq(b.seq_id[i]).len = b.pos[i] + 1;
  }
  logits_of(x_.data(), B, rows, out_row, logits);
}

// A run of rows at positions pos0, pos0 + 1, ...: their RoPE table (cos_, sin_) and their
// embeddings (x_): a prompt chunk's.
void Session::embed_run(const Batch& b, const std::vector<int64_t>& rows, int64_t pos0) {
  const model::ModelConfig& cfg = m_.config();
  const int64_t T = static_cast<int64_t>(rows.size()), C = cfg.d_model;
  const size_t half = static_cast<size_t>(cfg.head_dim / 2);
  cos_.resize(static_cast<size_t>(T) * half);
  sin_.resize(cos_.size());
  nn::rope_table(cos_.data(), sin_.data(), pos0, T, cfg.head_dim, m_.rope_inv_freq());
  toks_.resize(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) toks_[static_cast<size_t>(t)] = b.tokens[static_cast<size_t>(rows[static_cast<size_t>(t)])];
  x_.resize(static_cast<size_t>(T * C));
  m_.embed(x_.data(), toks_.data(), T);
}

void Session::decode_chunk(const Batch& b, const std::vector<int64_t>& rows,
                           const std::vector<int64_t>& out_row, float* logits) {
  const model::ModelConfig& cfg = m_.config();
  const int64_t T = static_cast<int64_t>(rows.size());
  const size_t first = static_cast<size_t>(rows[0]);
  const int64_t pos0 = b.pos[first];
  KvStore::Seq& s = kv_.seq(b.seq_id[first]);
  embed_run(b, rows, pos0);
  std::vector<nn::KVPool>& pools = kv_.pools();
  const int64_t table_len = static_cast<int64_t>(s.table.size());
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    // The chunk's K/V go into the blocks; its attention reads every position in them in place.
    m_.layer(ctx_, l, layer_, x_.data(), x_.data(), T, [&](float* out, const float* an) {
      nn::attn_layer_fwd_paged(ctx_, out, layer_.attn, an, m_.attn_weights(l), cfg.attn_shape(l), T,
                               cos_.data(), sin_.data(), pools[static_cast<size_t>(l)],
                               s.table.data(), table_len, pos0);
    });
  }
  s.len = pos0 + T;
  logits_of(x_.data(), T, rows, out_row, logits);
}

void Session::logits_of(const float* x, int64_t N, const std::vector<int64_t>& rows,
                        const std::vector<int64_t>& out_row, float* logits) {
  const int64_t C = m_.config().d_model, V = m_.config().vocab_size;
  // The rows that want logits (k local to x) and where they go.
  std::vector<int64_t> ks, outs;
  for (int64_t k = 0; k < N; ++k) {
    const int64_t o = out_row[static_cast<size_t>(rows[static_cast<size_t>(k)])];
    if (o >= 0) {
      ks.push_back(k);
      outs.push_back(o);
    }
  }
  if (ks.empty()) return;
  const int64_t n = static_cast<int64_t>(ks.size());
  // Consecutive rows to consecutive logits rows (a decode step's, a chunk's last row or every
  // row): the head writes in place.
  if (ks.back() - ks.front() == n - 1 && outs.back() - outs.front() == n - 1) {
    m_.head(ctx_, logits + outs.front() * V, x + ks.front() * C, n, normed_, rstd_);
    return;
  }
  picked_.resize(static_cast<size_t>(n * C));
  for (int64_t j = 0; j < n; ++j) {
    std::memcpy(&picked_[static_cast<size_t>(j * C)], x + ks[static_cast<size_t>(j)] * C,
                sizeof(float) * static_cast<size_t>(C));
  }
  head_out_.resize(static_cast<size_t>(n * V));
  m_.head(ctx_, head_out_.data(), picked_.data(), n, normed_, rstd_);
  for (int64_t j = 0; j < n; ++j) {
    std::memcpy(logits + outs[static_cast<size_t>(j)] * V, &head_out_[static_cast<size_t>(j * V)],
                sizeof(float) * static_cast<size_t>(V));
  }
}

}  // namespace diffattn::infer
