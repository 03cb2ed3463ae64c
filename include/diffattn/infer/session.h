// An inference session: a model shared read-only (const&), a KV store, and the scratch one
// forward needs. decode(batch) is the one way tokens go through the model for inference: the
// session, not the model, changes (llama.cpp's llama_context and llama_decode).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "diffattn/infer/batch.h"
#include "diffattn/infer/kv_store.h"
#include "diffattn/model/model.h"
#include "diffattn/nn/backend.h"

namespace diffattn::infer {

class Session {
 public:
  // The model and the store must outlive the session; one thread at a time uses it (a model
  // may serve several sessions on several threads: it is only read). Every layer's hot ops run
  // through ctx (nn/backend.h: the cpu table by default, the reference one for checking); a
  // backend lacking one the model needs is an InvalidArgument here.
  Session(const model::Model& m, KvStore& kv, const nn::ExecContext& ctx = nn::cpu_context());
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  const model::Model& model() const { return m_; }
  KvStore& kv() { return kv_; }

  // Runs the batch's rows: each row's K/V go into its sequence's blocks, and the rows whose
  // logits are wanted get them, in row order, in logits (batch.n_logits(), V).
  //   - A sequence's rows continue it: at positions len, len + 1, ... (its KvStore length,
  //     advanced here), within the blocks of its table and the model's max_seq_len.
  //   - Sequences with one row are decode steps, batched: every matrix product (attention
  //     projections, FFN, output head) runs once over those rows, and each layer's attention
  //     is one attention_paged call over all of them, reading the blocks in place.
  //   - A sequence with several rows is a prompt chunk, run after the decode steps, one
  //     sequence at a time: its attention reads the sequence's positions in its blocks in
  //     place (nn::attn_layer_fwd_paged: the tiled forward packs each K/V tile from them).
  //   - A contiguous store's one sequence is a paged sequence of one block: the same paths.
  // Each row's logits equal a contiguous-cache forward of that sequence alone up to the order
  // of the sums. Throws InvalidArgument (nothing run) for a malformed batch.
  void decode(const Batch& batch, float* logits);

 private:
  // The decode steps: rows (B) of one-row sequences, their logits into out rows.
  void decode_rows(const Batch& batch, const std::vector<int64_t>& rows,
                   const std::vector<int64_t>& out_row, float* logits);
  // One sequence's prompt chunk: rows (T, consecutive positions from the sequence's length).
  void decode_chunk(const Batch& batch, const std::vector<int64_t>& rows,
                    const std::vector<int64_t>& out_row, float* logits);
  // RoPE table and embeddings of a run of rows at consecutive positions from pos0.
  void embed_run(const Batch& batch, const std::vector<int64_t>& rows, int64_t pos0);
  // A recurrent (SambaY) model's rows (infer/sambay.cpp): the decode steps of one-row
  // sequences batched, or one sequence's chunk.
  void sambay_rows(const Batch& batch, const std::vector<int64_t>& rows,
                   const std::vector<int64_t>& out_row, float* logits);
  void sambay_chunk(const Batch& batch, const std::vector<int64_t>& rows,
                    const std::vector<int64_t>& out_row, float* logits);
  // x_ (N rows) through layers [l0, l1): the two LayerNorms, the MLP and each layer's mixer
  // (`mixer(l, out, normed)` runs the attention kinds; Mamba and GMU run here on seqs').
  void sambay_layers(int64_t l0, int64_t l1, int64_t N, const std::vector<nn::MambaSeq>* mseqs,
                     const std::function<void(int64_t, float*, const float*)>& mixer);
  // The logits of the rows of x (N, C) that want them: x's row k is batch row rows[k], whose
  // logits go to row out_row[rows[k]] of logits (-1: not wanted).
  void logits_of(const float* x, int64_t N, const std::vector<int64_t>& rows,
                 const std::vector<int64_t>& out_row, float* logits);

  const model::Model& m_;
  nn::ExecContext ctx_;
  KvStore& kv_;
  // Reused by every layer and every call: after the first calls, a step allocates nothing.
  model::Model::LayerActs layer_;
  std::vector<float> x_, cos_, sin_, picked_, normed_, rstd_, head_out_;
  std::vector<int32_t> toks_, tables_;
  std::vector<int64_t> lens_;
  // SambaY
  nn::MambaActs mamba_;
  // A decode step's sequences: their states, a Mamba layer's view of them, their rings.
  std::vector<KvStore::Seq*> seqs_;
  std::vector<nn::MambaSeq> mseqs_, mseqs_at_;
  std::vector<nn::WindowSeq> wseqs_;
  nn::KVCache window_;  // a chunk's window positions, contiguous
  std::vector<float> ln_, mix_, fc_, hid_, mem_;
};

}  // namespace diffattn::infer
