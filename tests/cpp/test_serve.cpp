// The serving engine and the OpenAI request layer (src/serve/) and the inference room under it
// (src/infer/): the KV block allocator, Session::decode over paged and contiguous stores (against the full forward), the
// continuous-batching scheduler against infer::generate_ids (the oracle: one sequence alone in a
// cache of its own), chunked prefill, waiting for blocks, the bounded queue, cancellation, request
// parsing and chat templates (the engine of src/tokenize, here through the server's wrapper)
// against hand-written expected strings.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>
#include <thread>
#include <tuple>

#include "diffattn/infer/session.h"
#include "diffattn/train/train.h"
#include "diffattn/model/train_context.h"
#include "http/request_head.h"
#include "diffattn/infer/scheduler.h"
#include "serve/constraint.h"
#include "serve/openai.h"
#include "one_sequence.h"

using namespace diffattn;
using namespace diffattn::serve;
using diffattn::infer::BlockAllocator;

namespace {

model::Model tiny_model(nn::AttnKind kind, uint64_t seed) {
  model::ModelConfig c;
  c.attention = kind;
  c.vocab_size = 61;
  c.d_model = 32;
  c.n_layers = 2;
  c.ffn_dim = 48;
  c.max_seq_len = 96;
  c.head_dim = 8;
  c.n_heads = kind == nn::AttnKind::Standard ? 4 : 2;
  c.n_kv_heads = kind == nn::AttnKind::Standard ? 2 : 1;
  model::Model m(c);
  m.init_weights(seed);
  // Larger output weights: decisive argmaxes, so greedy ids do not hinge on the last bit.
  const model::TensorInfo& head = m.tensor(c.tie_embeddings ? "embed_tokens.weight" : "lm_head.weight");
  for (int64_t i = 0; i < head.numel; ++i) m.params()[static_cast<size_t>(head.offset + i)] *= 25.0f;
  return m;
}

std::vector<int32_t> prompt_of(int64_t n, int32_t salt, int64_t V) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < n; ++i) p.push_back(static_cast<int32_t>((i * 7 + salt * 13 + 1) % V));
  return p;
}

// All tokens of a sequence, waiting until it ends.
std::vector<int32_t> drain(infer::Sequence& s, infer::Finish* how = nullptr) {
  std::vector<int32_t> out;
  for (;;) {
    const infer::Finish f = s.wait(out.size(), out, std::chrono::milliseconds(200));
    if (f != infer::Finish::kNone) {
      s.wait(out.size(), out, std::chrono::milliseconds(0));
      if (how) *how = f;
      return out;
    }
  }
}

}  // namespace

TEST(BlockAllocator, AllocatesReleasesAndRefusesWhatItDoesNotHave) {
  BlockAllocator a(10, 16);
  EXPECT_EQ(a.blocks_for(0), 0);
  EXPECT_EQ(a.blocks_for(1), 1);
  EXPECT_EQ(a.blocks_for(16), 1);
  EXPECT_EQ(a.blocks_for(17), 2);
  std::vector<int32_t> t1, t2, t3;
  ASSERT_TRUE(a.allocate(4, t1));
  ASSERT_TRUE(a.allocate(6, t2));
  EXPECT_EQ(a.free_blocks(), 0);
  EXPECT_FALSE(a.allocate(1, t3));
  EXPECT_TRUE(t3.empty());
  // Every block once.
  std::vector<int32_t> all = t1;
  all.insert(all.end(), t2.begin(), t2.end());
  std::sort(all.begin(), all.end());
  for (int32_t i = 0; i < 10; ++i) EXPECT_EQ(all[static_cast<size_t>(i)], i);
  a.release(t1);
  EXPECT_TRUE(t1.empty());
  EXPECT_EQ(a.free_blocks(), 4);
  ASSERT_TRUE(a.allocate(4, t3));
  std::vector<int32_t> bogus = {t3[0]};
  a.release(t3);
  EXPECT_THROW(a.release(bogus), InvalidArgument);  // already free
  std::vector<int32_t> twice = {t2[0], t2[0]};
  EXPECT_THROW(a.release(twice), InvalidArgument);
  EXPECT_EQ(a.free_blocks(), 4);  // a refused release frees nothing
  std::vector<int32_t> outside = {10};
  EXPECT_THROW(a.release(outside), InvalidArgument);
  EXPECT_THROW(BlockAllocator(0, 16), InvalidArgument);
  EXPECT_THROW(BlockAllocator(4, 0), InvalidArgument);
}

class EngineKinds : public ::testing::TestWithParam<nn::AttnKind> {};

// Where the KV stores lie (base/memory.h): every row on a cache line and the values half a page
// off the keys, for the contiguous cache and the paged pool, in each storage type. The decode
// kernel's speed depends on it (a 16-byte offset splits every vector load across two lines).
// The prefix cache's bookkeeping: a registered block is found by its key and tokens (a
// reference taken), kept when released, handed out again least recently used first (its key
// forgotten), and free blocks count the cached ones nothing refers to.
TEST(BlockAllocator, PrefixCacheKeysReferencesAndEviction) {
  BlockAllocator a(3, 2);
  const std::vector<int32_t> p = {1, 2, 3, 4}, q = {1, 2, 9, 9};
  const uint64_t k0 = a.key_of(BlockAllocator::kRootKey, p.data());
  const uint64_t k1 = a.key_of(k0, p.data() + 2);
  EXPECT_NE(k1, a.key_of(k0, q.data() + 2));
  EXPECT_NE(k0, a.key_of(k1, p.data()));  // the same tokens after another prefix
  std::vector<int32_t> t1, t2;
  ASSERT_TRUE(a.allocate(2, t1));
  EXPECT_EQ(a.lookup(k0, p.data()), -1);
  EXPECT_TRUE(a.register_block(t1[0], BlockAllocator::kRootKey, p.data()));  // under k0
  EXPECT_TRUE(a.register_block(t1[1], k0, p.data() + 2));                    // under k1
  EXPECT_FALSE(a.register_block(t1[1], k0, p.data() + 2));  // once
  EXPECT_EQ(a.cached_blocks(), 2);
  EXPECT_EQ(a.lookup(k0, q.data() + 2), -1);  // the key with other tokens: not a hit
  const int32_t b0 = a.lookup(k0, p.data());
  EXPECT_EQ(b0, t1[0]);
  t2.push_back(b0);
  a.release(t1);  // t1[0] still referred to by t2; t1[1] cached and free
  EXPECT_EQ(a.free_blocks(), 2);
  EXPECT_EQ(a.cached_blocks(), 2);
  a.release(t2);
  EXPECT_EQ(a.free_blocks(), 3);
  // The never-used block first, then the least recently used cached one (t1[1], released
  // before t1[0]): its key goes.
  std::vector<int32_t> t3;
  ASSERT_TRUE(a.allocate(2, t3));
  EXPECT_EQ(t3, (std::vector<int32_t>{2, 1}));
  EXPECT_EQ(a.cached_blocks(), 1);
  EXPECT_EQ(a.lookup(k1, p.data() + 2), -1);
  const int32_t again = a.lookup(k0, p.data());
  EXPECT_GE(again, 0);
  std::vector<int32_t> t4 = {again};
  EXPECT_FALSE(a.allocate(1, t3));  // every block referred to
  a.release(t4);
  a.release(t3);
  EXPECT_EQ(a.free_blocks(), 3);
  EXPECT_THROW(a.register_block(0, 7, p.data()), InvalidArgument);  // not allocated
}

// A prompt that ends inside a block: the cached blocks registered after the same prefix are
// searched for the longest run of its next tokens (a reference taken on the best); blocks
// registered after another prefix are not candidates; an evicted block is no longer found.
TEST(BlockAllocator, PartialBlocksAfterTheSamePrefix) {
  BlockAllocator a(4, 4);
  const std::vector<int32_t> head = {1, 2, 3, 4}, x = {5, 6, 7, 8}, y = {5, 6, 9, 9},
                             z = {7, 7, 7, 7};
  const uint64_t k0 = a.key_of(BlockAllocator::kRootKey, head.data());
  std::vector<int32_t> t;
  ASSERT_TRUE(a.allocate(4, t));
  EXPECT_TRUE(a.register_block(t[0], BlockAllocator::kRootKey, head.data()));
  EXPECT_TRUE(a.register_block(t[1], k0, x.data()));
  EXPECT_TRUE(a.register_block(t[2], k0, y.data()));
  EXPECT_TRUE(a.register_block(t[3], a.key_of(k0, x.data()), z.data()));  // after another prefix
  EXPECT_EQ(a.lookup(a.key_of(k0, x.data()), x.data()), t[1]);  // registered under key_of too
  std::vector<int32_t> found = {t[1]};
  a.release(found);
  int64_t matched = -1;
  const std::vector<int32_t> want = {5, 6, 7};
  EXPECT_EQ(a.lookup_partial(k0, want.data(), 3, matched), t[1]);
  EXPECT_EQ(matched, 3);
  const std::vector<int32_t> other = {5, 6, 9};
  EXPECT_EQ(a.lookup_partial(k0, other.data(), 3, matched), t[2]);
  EXPECT_EQ(matched, 3);
  const std::vector<int32_t> shorter = {5, 8, 8};
  const int32_t one = a.lookup_partial(k0, shorter.data(), 3, matched);
  EXPECT_TRUE(one == t[1] || one == t[2]);
  EXPECT_EQ(matched, 1);
  EXPECT_EQ(a.lookup_partial(k0, z.data(), 3, matched), -1);  // z follows x, not head
  EXPECT_EQ(matched, 0);
  EXPECT_EQ(a.lookup_partial(a.key_of(k0, x.data()), want.data(), 3, matched), -1);
  EXPECT_EQ(a.lookup_partial(a.key_of(k0, x.data()), z.data(), 3, matched), t[3]);
  EXPECT_EQ(matched, 3);
  std::vector<int32_t> ref_z = {t[3]};
  a.release(ref_z);
  EXPECT_EQ(a.lookup_partial(k0, want.data(), 0, matched), -1);
  EXPECT_THROW(a.lookup_partial(k0, want.data(), 4, matched), InvalidArgument);  // a whole block
  // Three references were taken (t[1], t[2], one of them): all released, every block free.
  std::vector<int32_t> refs = {t[1], t[2]}, ref_one = {one};
  a.release(t);
  a.release(refs);
  a.release(ref_one);
  EXPECT_EQ(a.free_blocks(), 4);
  // Evicted (handed out again): no longer a candidate.
  std::vector<int32_t> u;
  ASSERT_TRUE(a.allocate(4, u));
  EXPECT_EQ(a.lookup_partial(k0, want.data(), 3, matched), -1);
  EXPECT_EQ(a.cached_blocks(), 0);
  a.release(u);
}

TEST(KvStorage, RowsOnCacheLinesValuesHalfAPageOffTheKeys) {
  nn::AttnLayerShape s;
  s.kind = nn::AttnKind::DiffV1, s.C = 64, s.H = 2, s.G = 2, s.D = 16;
  const auto page_offset = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 4096; };
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(dt));
    nn::KVCache cache;
    cache.reset(s, 2, 37, dt);  // sizes that are no multiple of a line or a page
    const void* k = cache.k.data();
    const void* v = cache.v.data();
    EXPECT_EQ(cache.k.size(), 2u * 37 * s.n_k() * dtype_size(dt));
    EXPECT_EQ(cache.v_at(3 * s.n_v()), cache.v.data() + 3 * s.n_v() * dtype_size(dt));
    EXPECT_EQ(page_offset(k), 0u);
    EXPECT_EQ(page_offset(v), 2048u);
    nn::KVPool pool;
    pool.reset(s, 3, 5, dt);
    k = pool.k.get();
    v = pool.v.get();
    EXPECT_EQ(pool.bytes(), 3 * 5 * (s.n_k() + s.n_v()) * static_cast<int64_t>(dtype_size(dt)));
    EXPECT_EQ(page_offset(k), 0u);
    EXPECT_EQ(page_offset(v), 2048u);
    // Another reset reallocates in place of the old stores, placed the same way.
    cache.reset(s, 1, 1000, dt);
    v = cache.v.data();
    EXPECT_EQ(page_offset(v), 2048u);
  }
}

// One decode step of sequences of different lengths through Session::decode (a batch of one
// row per sequence: the products over the batch, one paged attention call per layer), their
// prompts prefilled in two chunks (a batch each: the second chunk gathers the first) into
// shuffled blocks of the store, against each sequence alone in a contiguous store (its own
// session): the same logits up to the order of the sums (the batched products; the split-KV
// decode's, where the contiguous store's short cache takes the tiled forward), bounded by a few float32
// roundings of the longest dot product. Then a batch mixing both kinds of rows and asking for
// every row's logits, against the same rows run apart.
TEST_P(EngineKinds, SessionDecodeEqualsInferAlone) {
  model::Model m = tiny_model(GetParam(), 11);
  const int64_t V = m.config().vocab_size, C = m.config().d_model, F = m.config().ffn_dim;
  const int B = 5;
  const int64_t bs = 4, per_seq = 6, n_blocks = B * per_seq + 3;
  infer::KvStore kv(m, n_blocks, bs);
  infer::Session session(m, kv);
  std::vector<int32_t> ids;
  ASSERT_TRUE(kv.blocks().allocate(n_blocks, ids));
  std::mt19937 rng(5);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int32_t> next(B), seq(B);
  std::vector<float> logits(static_cast<size_t>(V)), alone(static_cast<size_t>(B * V)),
      prefill(static_cast<size_t>(V)), alone_prefill(static_cast<size_t>(V));
  auto tol_of = [&](const float* x) {
    float scale = 0;
    for (int64_t v = 0; v < V; ++v) scale = std::max(scale, std::fabs(x[v]));
    return 8.0f * std::numeric_limits<float>::epsilon() *
           std::sqrt(static_cast<float>(std::max(C, F))) * scale;
  };
  infer::Batch batch;
  for (int b = 0; b < B; ++b) {
    const std::vector<int32_t> p = prompt_of(1 + 4 * b, b, V);
    const int64_t P = static_cast<int64_t>(p.size()), n1 = std::max<int64_t>(1, P / 2);
    next[static_cast<size_t>(b)] = static_cast<int32_t>((b * 5 + 2) % V);
    // alone: a contiguous cache of its own
    diffattn::testing::OneSequence cache(m, 40);
    cache.infer(p.data(), P, alone_prefill.data());
    cache.infer(&next[static_cast<size_t>(b)], 1, &alone[static_cast<size_t>(b * V)]);
    // paged: this sequence's blocks, its prompt in two chunks
    seq[static_cast<size_t>(b)] = kv.open();
    EXPECT_EQ(seq[static_cast<size_t>(b)], b);
    infer::KvStore::Seq& s = kv.seq(seq[static_cast<size_t>(b)]);
    s.table.assign(ids.begin() + b * per_seq, ids.begin() + (b + 1) * per_seq);
    batch.clear();
    batch.add_chunk(p.data(), n1, 0, seq[static_cast<size_t>(b)]);
    session.decode(batch, prefill.data());
    if (n1 < P) {
      batch.clear();
      batch.add_chunk(p.data() + n1, P - n1, n1, seq[static_cast<size_t>(b)]);
      session.decode(batch, prefill.data());
    }
    EXPECT_EQ(s.len, P);
    const float tol = tol_of(alone_prefill.data());
    for (int64_t v = 0; v < V; ++v) {
      ASSERT_NEAR(prefill[static_cast<size_t>(v)], alone_prefill[static_cast<size_t>(v)], tol)
          << "prefill of sequence " << b << " logit " << v;
    }
  }
  batch.clear();
  for (int b = 0; b < B; ++b) {
    batch.add(next[static_cast<size_t>(b)], kv.seq(b).len, b, true);
  }
  // A block id outside the pool, or more positions than the table holds, is refused before
  // anything is written, naming the sequence.
  const int32_t kept = kv.seq(2).table[0];
  kv.seq(2).table[0] = static_cast<int32_t>(n_blocks);
  std::vector<float> rows(static_cast<size_t>(B * V));
  try {
    session.decode(batch, rows.data());
    ADD_FAILURE() << "a block outside the pool was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("sequence 2"), std::string::npos) << e.what();
  }
  kv.seq(2).table[0] = kept;
  infer::Batch too_long = batch;
  too_long.pos[3] = per_seq * bs;
  kv.seq(3).len = per_seq * bs;
  EXPECT_THROW(session.decode(too_long, rows.data()), InvalidArgument);
  kv.seq(3).len = batch.pos[3];
  infer::Batch gap = batch;
  gap.pos[1] += 1;  // a row must continue its sequence
  EXPECT_THROW(session.decode(gap, rows.data()), InvalidArgument);
  session.decode(batch, rows.data());
  for (int b = 0; b < B; ++b) {
    EXPECT_EQ(kv.seq(b).len, batch.pos[static_cast<size_t>(b)] + 1);
    const float tol = tol_of(&alone[static_cast<size_t>(b * V)]);
    for (int64_t v = 0; v < V; ++v) {
      ASSERT_NEAR(rows[static_cast<size_t>(b * V + v)], alone[static_cast<size_t>(b * V + v)], tol)
          << "sequence " << b << " logit " << v;
    }
  }
  EXPECT_THROW(infer::KvStore(m, 0, bs), InvalidArgument);

  // One batch of a chunk of three rows of sequence 0 between single rows of sequences 1 and 4,
  // every row's logits asked for, equals the same rows run as two batches (after the lengths
  // are set back: the same positions written again with the same K/V), by a second session on
  // the same store.
  infer::Session s2(m, kv);
  std::vector<int64_t> before(B);
  for (int b = 0; b < B; ++b) before[static_cast<size_t>(b)] = kv.seq(b).len;
  const std::vector<int32_t> chunk = {3, 9, 27};
  infer::Batch mixed;
  mixed.add(5, before[1], 1, true);
  mixed.add_chunk(chunk.data(), 3, before[0], 0, true);
  mixed.add(7, before[4], 4, true);
  ASSERT_EQ(mixed.n_logits(), 5);
  std::vector<float> got(static_cast<size_t>(5 * V));
  s2.decode(mixed, got.data());
  EXPECT_EQ(kv.seq(0).len, before[0] + 3);
  EXPECT_EQ(kv.seq(4).len, before[4] + 1);
  for (int b = 0; b < B; ++b) kv.seq(b).len = before[static_cast<size_t>(b)];
  infer::Batch singles, alone_chunk;
  singles.add(5, before[1], 1, true);
  singles.add(7, before[4], 4, true);
  alone_chunk.add_chunk(chunk.data(), 3, before[0], 0, true);
  std::vector<float> want_singles(static_cast<size_t>(2 * V)), want_chunk(static_cast<size_t>(3 * V));
  session.decode(singles, want_singles.data());
  session.decode(alone_chunk, want_chunk.data());
  const std::vector<std::pair<const float*, const float*>> pairs = {
      {&got[0], &want_singles[0]},
      {&got[static_cast<size_t>(V)], &want_chunk[0]},
      {&got[static_cast<size_t>(2 * V)], &want_chunk[static_cast<size_t>(V)]},
      {&got[static_cast<size_t>(3 * V)], &want_chunk[static_cast<size_t>(2 * V)]},
      {&got[static_cast<size_t>(4 * V)], &want_singles[static_cast<size_t>(V)]}};
  for (size_t k = 0; k < pairs.size(); ++k) {
    for (int64_t v = 0; v < V; ++v) {
      ASSERT_EQ(pairs[k].first[v], pairs[k].second[v]) << "row " << k << " logit " << v;
    }
  }
}

// Sequences of different prompt lengths, joining while others run, each give the ids that
// generate_ids gives for it alone (greedy), and sampled ones the same ids for the same seed.
TEST_P(EngineKinds, BatchedSequencesMatchGenerateAlone) {
  // The pool in float32 and in BF16 (against generate_ids with a BF16 cache of its own).
  for (const DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    model::Model m = tiny_model(GetParam(), 3);
    model::Model ref = tiny_model(GetParam(), 3);
    const int64_t V = m.config().vocab_size;
    infer::SchedulerOptions eo;
    eo.block_size = 4;
    eo.n_blocks = 200;
    eo.prefill_chunk = 7;  // prompts of up to 30 tokens go in several chunks between decode steps
    eo.kv_dtype = dt;
    // The oracle's answers first: the reference model never runs beside the engine's thread
    // (two models computing at once on two threads is not what this test is about).
    std::vector<infer::SeqRequest> reqs;
    std::vector<std::vector<int32_t>> wants;
    for (int i = 0; i < 6; ++i) {
      infer::SeqRequest r;
      r.prompt = prompt_of(1 + i * 5, i, V);
      r.max_tokens = 20 + i;
      r.sampler.temperature = i % 2 == 0 ? 0.0 : 0.9;
      r.sampler.seed = 100 + static_cast<uint64_t>(i);
      reqs.push_back(r);
      infer::GenerateOptions go;
      go.max_new = r.max_tokens;
      go.sampler = r.sampler;
      go.kv_dtype = dt;
      wants.push_back(infer::generate_ids(ref, r.prompt, go));
    }
    infer::Scheduler e(m, eo);
    std::vector<std::shared_ptr<infer::Sequence>> seqs;
    for (int i = 0; i < 6; ++i) {
      seqs.push_back(e.submit(reqs[static_cast<size_t>(i)]));
      if (i == 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));  // join mid-run
    }
    for (size_t i = 0; i < seqs.size(); ++i) {
      infer::Finish how = infer::Finish::kNone;
      const std::vector<int32_t> got = drain(*seqs[i], &how);
      EXPECT_EQ(got, wants[i]) << "sequence " << i;
      EXPECT_EQ(how, infer::Finish::kLength);
      EXPECT_EQ(seqs[i]->prompt_tokens(), static_cast<int64_t>(reqs[i].prompt.size()));
    }
    const infer::SchedulerStats s = e.stats();
    EXPECT_EQ(s.free_blocks, s.total_blocks);
    EXPECT_EQ(s.running, 0);
  }
}

// A contiguous store (one sequence, the tiled forward against the whole cache): a prompt
// chunk then decode steps give the logits of the full forward over the same tokens at each
// position (F32 cache: float32 rounding; F16: within 32 unit roundoffs of the logits' size).
TEST_P(EngineKinds, ContiguousSessionMatchesTheFullForward) {
  model::Model m = tiny_model(GetParam(), 13);
  const int64_t V = m.config().vocab_size;
  const std::vector<int32_t> p = prompt_of(9, 3, V);
  const int64_t P = static_cast<int64_t>(p.size()), n = 6;
  std::vector<int32_t> all = p;
  for (int64_t i = 0; i < n; ++i) all.push_back(static_cast<int32_t>((i * 11 + 5) % V));
  const model::Model full_model = tiny_model(GetParam(), 13);
  model::TrainContext full_run(full_model);
  full_run.forward(all.data(), nullptr, 1, P + n);
  const std::vector<float> full = full_run.logits();
  for (const DType dt : {DType::F32, DType::F16}) {
    SCOPED_TRACE(dtype_name(dt));
    const double tol = dt == DType::F32 ? 2e-6 : 32.0 / 2048;
    std::vector<float> got(static_cast<size_t>(V));
    auto check = [&](int64_t pos) {
      double err = 0, scale = 0;
      for (int64_t v = 0; v < V; ++v) {
        const double w = full[static_cast<size_t>(pos * V + v)];
        err = std::max(err, std::abs(got[static_cast<size_t>(v)] - w));
        scale = std::max(scale, std::abs(w));
      }
      EXPECT_LT(err, tol * scale + 1e-6) << "position " << pos;
    };
    infer::KvStore kv(m, infer::KvStore::Contiguous{P + n}, dt);
    infer::Session session(m, kv);
    infer::Batch batch;
    batch.add_chunk(p.data(), P, 0, 0);
    session.decode(batch, got.data());
    check(P - 1);
    // Each decode step appends one token and gives the logits at its position; the last
    // step fills the cache to its capacity.
    for (int64_t i = 0; i < n; ++i) {
      batch.clear();
      batch.add(all[static_cast<size_t>(P + i)], P + i, 0, true);
      session.decode(batch, got.data());
      check(P + i);
    }
    EXPECT_EQ(kv.seq(0).len, P + n);
    batch.clear();
    batch.add(1, P + n, 0, true);
    EXPECT_THROW(session.decode(batch, got.data()), InvalidArgument);  // past the capacity
    EXPECT_THROW(kv.open(), InvalidArgument);
    EXPECT_THROW(kv.blocks(), InvalidArgument);
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, EngineKinds,
                         ::testing::Values(nn::AttnKind::DiffV1, nn::AttnKind::DiffV2,
                                           nn::AttnKind::Standard));

TEST(Scheduler, StopIdsEndASequenceWithoutEmittingThem) {
  model::Model m = tiny_model(nn::AttnKind::DiffV1, 5);
  model::Model ref = tiny_model(nn::AttnKind::DiffV1, 5);
  infer::SeqRequest r;
  r.prompt = prompt_of(5, 1, 61);
  r.max_tokens = 30;
  r.sampler.temperature = 0;
  infer::GenerateOptions go;
  go.max_new = 30;
  go.sampler = r.sampler;
  const std::vector<int32_t> free_run = infer::generate_ids(ref, r.prompt, go);
  ASSERT_GE(free_run.size(), 4u);
  r.stop_ids = {free_run[3]};
  infer::Scheduler e(m, infer::SchedulerOptions{});
  infer::Finish how = infer::Finish::kNone;
  const std::vector<int32_t> got = drain(*e.submit(r), &how);
  const auto first = std::find(free_run.begin(), free_run.end(), free_run[3]);
  EXPECT_EQ(got, std::vector<int32_t>(free_run.begin(), first));
  EXPECT_EQ(how, infer::Finish::kStop);
}

// logprob_of: the log-softmax at a temperature, the top ones in order (ties by id), -inf as -9999.
TEST(Scheduler, LogprobOfIsTheLogSoftmax) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> z = {1.0f, 3.0f, -inf, 3.0f, 0.5f};
  for (const double T : {1.0, 0.5, 0.0}) {
    const double t = T > 0 ? T : 1.0;
    double sum = 0;
    for (const float v : z) sum += std::exp(v / t);
    const infer::TokenLogprob lp = infer::logprob_of(z.data(), 5, T, 0, 3);
    EXPECT_NEAR(lp.logprob, 1.0 / t - std::log(sum), 1e-5);
    ASSERT_EQ(lp.top.size(), 3u);
    EXPECT_EQ(lp.top[0].first, 1);
    EXPECT_EQ(lp.top[1].first, 3);
    EXPECT_EQ(lp.top[2].first, 0);
    EXPECT_NEAR(lp.top[0].second, 3.0 / t - std::log(sum), 1e-5);
    EXPECT_EQ(infer::logprob_of(z.data(), 5, T, 2, 0).logprob, -9999.0f);
  }
  EXPECT_TRUE(infer::logprob_of(z.data(), 5, 1.0, 1, 0).top.empty());
}

// Logprobs from the engine: each generated token's equals logprob_of over the model's logits
// (greedy: the top one is the token), and the prompt's come one per prompt token after the first,
// from a prefill one position at a time that leaves the continuation unchanged.
TEST(Scheduler, LogprobsOfTokensAndOfThePrompt) {
  model::Model m = tiny_model(nn::AttnKind::DiffV1, 5);
  model::Model ref = tiny_model(nn::AttnKind::DiffV1, 5);
  infer::SeqRequest r;
  r.prompt = prompt_of(6, 1, 61);
  r.max_tokens = 5;
  r.sampler.temperature = 0;
  r.logprobs = 2;
  r.prompt_logprobs = true;
  infer::GenerateOptions go;
  go.max_new = 5;
  go.sampler = r.sampler;
  const std::vector<int32_t> want = infer::generate_ids(ref, r.prompt, go);
  infer::Scheduler e(m, infer::SchedulerOptions{});
  auto seq = e.submit(r);
  std::vector<int32_t> got;
  std::vector<infer::TokenLogprob> lps;
  while (seq->wait(got.size(), got, lps, std::chrono::milliseconds(200)) == infer::Finish::kNone) {
  }
  seq->wait(got.size(), got, lps, std::chrono::milliseconds(0));
  EXPECT_EQ(got, want);
  ASSERT_EQ(lps.size(), got.size());
  // The reference: the model's logits at each position, one token at a time through a
  // contiguous cache of its own (the engine's store is paged).
  const int64_t V = 61;
  std::vector<int32_t> all = r.prompt;
  all.insert(all.end(), got.begin(), got.end());
  diffattn::testing::OneSequence cache(ref, 96);
  std::vector<float> logits(V);
  std::vector<infer::TokenLogprob> want_lp;
  for (size_t i = 0; i + 1 < all.size(); ++i) {
    cache.infer(&all[i], 1, logits.data());
    want_lp.push_back(infer::logprob_of(logits.data(), V, 1.0, all[i + 1], 2));
  }
  const std::vector<infer::TokenLogprob> plp = seq->prompt_logprobs();
  ASSERT_EQ(plp.size(), r.prompt.size() - 1);
  for (size_t i = 0; i + 1 < all.size(); ++i) {
    const infer::TokenLogprob& g = i < plp.size() ? plp[i] : lps[i - plp.size()];
    EXPECT_EQ(g.id, all[i + 1]);
    EXPECT_NEAR(g.logprob, want_lp[i].logprob, 1e-3) << i;
    ASSERT_EQ(g.top.size(), 2u);
    EXPECT_EQ(g.top[0].first, want_lp[i].top[0].first) << i;
  }
  for (const infer::TokenLogprob& g : lps) EXPECT_EQ(g.top[0].first, g.id);  // greedy
}

// The scheduler's constraint interface without a grammar: a constraint that allows only even
// ids and closes after three tokens gives three even ids and kStop; one that allows nothing
// ends at once (kStop when complete, kError when not); one over another vocabulary is refused
// at submit, naming both sizes.
class EvenIds final : public infer::OutputConstraint {
 public:
  EvenIds(int64_t V, int64_t len, bool none) : V_(V), len_(len), none_(none) {}
  void allowed(std::vector<uint8_t>& mask) override {
    mask.assign(static_cast<size_t>(V_), 0);
    for (int64_t i = 0; i < V_ && !none_; i += 2) mask[static_cast<size_t>(i)] = 1;
  }
  bool advance(int32_t id) override {
    if (id % 2 != 0 || none_) return false;
    ++taken_;
    return true;
  }
  bool complete() const override { return taken_ >= len_; }
  bool closed() const override { return taken_ >= len_; }

 private:
  int64_t V_, len_, taken_ = 0;
  bool none_;
};

class EvenSource final : public infer::ConstraintSource {
 public:
  EvenSource(int64_t V, int64_t len, bool none) : V_(V), len_(len), none_(none) {}
  int64_t vocab_size() const override { return V_; }
  std::unique_ptr<infer::OutputConstraint> start() const override {
    return std::make_unique<EvenIds>(V_, len_, none_);
  }

 private:
  int64_t V_, len_;
  bool none_;
};

TEST(Scheduler, OutputConstraintMasksAndEndsTheSequence) {
  const model::Model m = tiny_model(nn::AttnKind::DiffV2, 5);
  const int64_t V = m.config().vocab_size;
  infer::Scheduler e(m, infer::SchedulerOptions{});
  for (uint64_t seed = 0; seed < 4; ++seed) {
    infer::SeqRequest r;
    r.prompt = prompt_of(5, static_cast<int32_t>(seed), V);
    r.max_tokens = 10;
    r.sampler.temperature = 1.0;
    r.sampler.seed = seed;
    r.constraint = std::make_shared<const EvenSource>(V, 3, false);
    infer::Finish how = infer::Finish::kNone;
    const std::vector<int32_t> got = drain(*e.submit(r), &how);
    EXPECT_EQ(how, infer::Finish::kStop);
    ASSERT_EQ(got.size(), 3u);
    for (const int32_t id : got) EXPECT_EQ(id % 2, 0) << id;
  }
  for (const int64_t len : {0, 1}) {  // nothing allowed: complete (len 0) or stuck
    infer::SeqRequest r;
    r.prompt = prompt_of(5, 1, V);
    r.constraint = std::make_shared<const EvenSource>(V, len, true);
    infer::Finish how = infer::Finish::kNone;
    const std::shared_ptr<infer::Sequence> s = e.submit(r);
    EXPECT_TRUE(drain(*s, &how).empty());
    EXPECT_EQ(how, len == 0 ? infer::Finish::kStop : infer::Finish::kError);
    if (len == 1) {
      EXPECT_NE(s->error().find("no token of the vocabulary"), std::string::npos) << s->error();
    }
  }
  infer::SeqRequest r;
  r.prompt = prompt_of(5, 1, V);
  r.constraint = std::make_shared<const EvenSource>(V + 1, 3, false);
  try {
    e.submit(r);
    ADD_FAILURE() << "a constraint over another vocabulary was queued";
  } catch (const InvalidArgument& err) {
    EXPECT_NE(std::string(err.what()).find(std::to_string(V + 1)), std::string::npos) << err.what();
  }
}

// Constrained output on a random model: over a vocabulary of single characters, an enum-only
// object comes out whole (one of the enum's values, at most one space) and ends the sequence
// (kStop: nothing may follow), well within a few dozen tokens, for every seed.
TEST(Scheduler, ResponseFormatSchemaClosesTheObject) {
  model::Model m = tiny_model(nn::AttnKind::DiffV1, 11);
  const std::string chars = "{}[]\":, 0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQ";
  ASSERT_EQ(chars.size(), 61u);
  std::vector<std::string> bytes;
  for (const char c : chars) bytes.emplace_back(1, c);
  auto masker = std::make_shared<const grammar::TokenMasker>(bytes, std::vector<int32_t>{});
  const grammar::Grammar g = grammar::Grammar::json_schema_text(
      R"({"type":"object","properties":{"color":{"enum":["red","green","blue"]}},)"
      R"("required":["color"],"additionalProperties":false})");
  infer::Scheduler e(m, infer::SchedulerOptions{});
  for (uint64_t seed = 0; seed < 12; ++seed) {
    infer::SeqRequest r;
    r.prompt = prompt_of(4, static_cast<int32_t>(seed), 61);
    r.max_tokens = 40;
    r.sampler.temperature = 1.5;
    r.sampler.seed = seed;
    r.constraint = serve::grammar_constraint(g, masker);
    infer::Finish how = infer::Finish::kNone;
    const std::vector<int32_t> got = drain(*e.submit(r), &how);
    std::string text;
    for (const int32_t id : got) text += chars[static_cast<size_t>(id)];
    EXPECT_EQ(how, infer::Finish::kStop) << text;
    EXPECT_LE(got.size(), 20u) << text;
    bool ok = false;
    for (const char* c : {"red", "green", "blue"}) {
      for (const char* sp : {"", " "}) ok = ok || text == std::string("{\"color\":") + sp + "\"" + c + "\"}";
    }
    EXPECT_TRUE(ok) << text;
  }
  // A grammar needs a masker (one over another vocabulary is refused at submit: the test
  // above).
  EXPECT_THROW(serve::grammar_constraint(g, nullptr), InvalidArgument);
}

// Prefix caching: the same prompts, one after another and with others between them, in a pool
// small enough that cached blocks are evicted: every sequence gives generate_ids' tokens (the
// oracle: one sequence alone, no cache) with the cache on and off, the repeated prompts take
// their whole blocks but the last token from the cache, and the stats count it.
TEST(Scheduler, PrefixCacheGivesTheSameTokensAndCountsItsHits) {
  model::Model ref = tiny_model(nn::AttnKind::DiffV1, 9);
  const int64_t V = 61;
  std::vector<std::vector<int32_t>> prompts;
  for (int32_t s = 0; s < 4; ++s) prompts.push_back(prompt_of(21 + s, s, V));
  prompts.push_back(prompts[3]);  // again, its blocks still cached
  prompts.push_back(prompts[0]);  // again, its blocks evicted by now
  std::vector<int32_t> longer = prompts[1];
  longer.insert(longer.end(), {5, 6, 7, 8, 9, 10, 11, 12, 13});
  prompts.push_back(longer);      // begins as prompts[1], whose blocks were evicted
  prompts.push_back(prompt_of(16, 0, V));  // two blocks, the beginning of prompts[0]
  std::vector<std::vector<int32_t>> want;
  for (const auto& p : prompts) {
    infer::GenerateOptions go;
    go.max_new = 6;
    go.sampler.temperature = 0;
    want.push_back(infer::generate_ids(ref, p, go));
  }
  for (const bool cache : {true, false}) {
    model::Model m = tiny_model(nn::AttnKind::DiffV1, 9);
    infer::SchedulerOptions o;
    o.block_size = 8;
    o.n_blocks = 9;  // two sequences of 4 blocks and one more: older cached blocks are evicted
    o.prefill_chunk = 5;
    o.prefix_cache = cache;
    infer::Scheduler e(m, o);
    std::vector<int64_t> cached;
    for (size_t i = 0; i < prompts.size(); ++i) {
      infer::SeqRequest r;
      r.prompt = prompts[i];
      r.max_tokens = 6;
      r.sampler.temperature = 0;
      auto seq = e.submit(r);
      EXPECT_EQ(drain(*seq), want[i]) << "prompt " << i << (cache ? " with" : " without") << " the cache";
      cached.push_back(seq->cached_tokens());
    }
    if (!cache) {
      EXPECT_EQ(cached, std::vector<int64_t>(prompts.size(), 0));
      EXPECT_EQ(e.stats().cached_prompt_tokens, 0);
      continue;
    }
    // prompts[3] again: 24 tokens, the last computed: two of its three blocks and 7 rows of the
    // third (copied from its cached third block); prompts[0] (first used, first evicted) and
    // prompts[1] are gone; the 16-token beginning of prompts[0], cached again by its second
    // run: one block and 7 rows of its second (the last token computed).
    EXPECT_EQ(cached, (std::vector<int64_t>{0, 0, 0, 0, 23, 0, 0, 15}));
    EXPECT_EQ(e.stats().cached_prompt_tokens, 38);
    EXPECT_GT(e.stats().cached_blocks, 0);
    EXPECT_EQ(e.stats().free_blocks, 9);
  }
}

// A pool that holds one sequence at a time: the others wait for its blocks, none is refused and
// none is corrupted; a queue bounded at 2 refuses the fourth.
TEST(Scheduler, FullPoolQueuesThenRefusesBeyondTheQueue) {
  model::Model m = tiny_model(nn::AttnKind::DiffV1, 7);
  model::Model ref = tiny_model(nn::AttnKind::DiffV1, 7);
  infer::SchedulerOptions eo;
  eo.block_size = 8;
  eo.n_blocks = 5;  // 40 positions: one sequence of 10 + 25
  eo.max_waiting = 2;
  // The engine holds before its second step until every submission is in: without the hold a
  // fast engine can finish the first sequence (and admit a waiting one) during the submissions.
  std::atomic<bool> submitted{false};
  eo.before_step = [&](int64_t step) {
    while (step >= 1 && !submitted.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  };
  infer::Scheduler e(m, eo);
  infer::SeqRequest r;
  r.prompt = prompt_of(10, 2, 61);
  r.max_tokens = 25;
  r.sampler.temperature = 0;
  infer::GenerateOptions go;
  go.max_new = 25;
  go.sampler = r.sampler;
  const std::vector<int32_t> want = infer::generate_ids(ref, r.prompt, go);
  // The engine's thread may admit the first at once (then two more fit the queue) or not yet
  // (then the third submission finds the queue full): count refusals, not their position.
  std::vector<std::shared_ptr<infer::Sequence>> seqs;
  int refused = 0;
  for (int i = 0; i < 6; ++i) {
    try {
      seqs.push_back(e.submit(r));
    } catch (const infer::QueueFull& q) {
      ++refused;
      EXPECT_NE(std::string(q.what()).find("at capacity"), std::string::npos);
    }
  }
  submitted = true;
  EXPECT_GE(refused, 3);
  EXPECT_LE(seqs.size(), 3u);
  for (auto& s : seqs) EXPECT_EQ(drain(*s), want);
  // A request the pool can never hold is refused at once, not queued for ever.
  infer::SeqRequest big = r;
  big.max_tokens = 40;
  EXPECT_THROW(e.submit(big), InvalidArgument);
  infer::SeqRequest too_long = r;
  too_long.max_tokens = 90;  // past max_seq_len 96
  EXPECT_THROW(e.submit(too_long), InvalidArgument);
  infer::SeqRequest bad_token = r;
  bad_token.prompt[0] = 61;
  EXPECT_THROW(e.submit(bad_token), InvalidArgument);
}

TEST(Scheduler, CancelFreesTheBlocksAndOthersGoOn) {
  model::Model m = tiny_model(nn::AttnKind::DiffV1, 9);
  model::Model ref = tiny_model(nn::AttnKind::DiffV1, 9);
  infer::SchedulerOptions eo;
  eo.block_size = 4;
  eo.n_blocks = 64;
  // The engine stops before its third step until the test has cancelled: without the hold a fast
  // machine can generate all 80 tokens between the first token and the cancel.
  std::atomic<bool> cancelled{false};
  eo.before_step = [&](int64_t step) {
    while (step >= 2 && !cancelled.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  };
  infer::SeqRequest r;
  r.prompt = prompt_of(6, 4, 61);
  r.max_tokens = 80;
  r.sampler.temperature = 0;
  infer::GenerateOptions go;
  go.max_new = 80;
  go.sampler = r.sampler;
  const std::vector<int32_t> want = infer::generate_ids(ref, r.prompt, go);
  infer::Scheduler e(m, eo);
  auto a = e.submit(r);
  auto b = e.submit(r);
  std::vector<int32_t> some;
  while (some.empty()) a->wait(0, some, std::chrono::milliseconds(100));
  a->cancel();
  cancelled = true;
  infer::Finish how = infer::Finish::kNone;
  std::vector<int32_t> got = drain(*a, &how);
  EXPECT_EQ(how, infer::Finish::kCancelled);
  EXPECT_LT(got.size(), 80u);
  EXPECT_EQ(drain(*b), want);
  for (int i = 0; i < 100 && e.stats().free_blocks != e.stats().total_blocks; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(e.stats().free_blocks, e.stats().total_blocks);
  // A sequence past its deadline ends as a timeout.
  infer::SeqRequest late = r;
  late.deadline = std::chrono::steady_clock::now();
  drain(*e.submit(late), &how);
  EXPECT_EQ(how, infer::Finish::kTimeout);
}

// ---- the request layer ----

TEST(OpenAiRequest, ParsesWhatTheApiTakes) {
  ApiLimits lim;
  ApiRequest r = parse_request(
      R"({"model":"m","prompt":"hi","max_tokens":5,"temperature":0,"top_p":0.5,"top_k":3,)"
      R"("seed":-4,"stop":["a","bc"],"n":2,"stream":true,"stream_options":{"include_usage":true},"user":"u"})",
      false, lim);
  EXPECT_EQ(r.prompt, "hi");
  EXPECT_EQ(*r.max_tokens, 5);
  EXPECT_EQ(r.top_k, 3);
  EXPECT_EQ(*r.seed, -4);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"a", "bc"}));
  EXPECT_EQ(r.n, 2);
  EXPECT_TRUE(r.stream && r.include_usage);
  r = parse_request(R"({"prompt":[1,2,3],"stop":"x","max_tokens":null})", false, lim);
  EXPECT_TRUE(r.prompt_is_ids);
  EXPECT_EQ(r.prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_FALSE(r.max_tokens.has_value());
  r = parse_request(R"({"messages":[{"role":"system","content":"s"},)"
                    R"({"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]})",
                    true, lim);
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[1].content, "ab");
  // The fields of issue 28: penalties, logit_bias, logprobs, echo, response_format.
  r = parse_request(R"({"prompt":"hi","presence_penalty":-0.5,"frequency_penalty":2,)"
                    R"("logit_bias":{"12":-100,"3":2.5},"logprobs":4,"echo":true,)"
                    R"("response_format":{"type":"json_object"}})", false, lim);
  EXPECT_EQ(r.presence_penalty, -0.5);
  EXPECT_EQ(r.frequency_penalty, 2);
  EXPECT_EQ(r.logit_bias, (std::vector<std::pair<int32_t, float>>{{3, 2.5f}, {12, -100.0f}}));
  EXPECT_TRUE(r.logprobs && r.echo);
  EXPECT_EQ(r.top_logprobs, 4);
  EXPECT_EQ(r.response_format, "json_object");
  EXPECT_TRUE(r.grammar.has_value());
  r = parse_request(R"({"prompt":"hi","logprobs":0})", false, lim);
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 0);
  r = parse_request(R"({"messages":[{"role":"assistant","content":"x","tool_calls":[]}],"logprobs":true,)"
                    R"("top_logprobs":3,"max_tokens":9,"max_completion_tokens":7,"tools":[],"store":false,)"
                    R"("stream_options":null,"response_format":{"type":"json_schema","json_schema":{"name":"c",)"
                    R"("strict":true,"schema":{"type":"object","properties":{"b":{"type":"integer"},)"
                    R"("a":{"enum":["x","y"]}},"required":["b","a"],"additionalProperties":false}}}})",
                    true, lim);
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 3);
  EXPECT_EQ(*r.max_tokens, 7);  // max_completion_tokens wins
  EXPECT_EQ(r.response_format, "json_schema");
  ASSERT_TRUE(r.grammar.has_value());
  {
    // The schema's properties in their written order: b, then a.
    grammar::Matcher m(*r.grammar);
    EXPECT_TRUE(m.advance(R"({"b":1,"a":"y"})"));
    EXPECT_TRUE(m.accepts_end());
    grammar::Matcher other(*r.grammar);
    EXPECT_FALSE(other.advance(R"({"a")"));
  }
  std::vector<std::string> ignored = r.ignored;
  std::sort(ignored.begin(), ignored.end());
  EXPECT_EQ(ignored, (std::vector<std::string>{"store"}));
  // tools and tool_calls reach the template (here both empty arrays).
  EXPECT_TRUE(r.tools.is_array() && r.tools.empty());
  EXPECT_TRUE(r.messages.at(0).message.at("tool_calls").is_array());
  // Unknown fields are ignored (and listed), not refused.
  r = parse_request(R"({"prompt":"x","bogus":1,"best_of":2,"stream":true,"stream_options":{"foo":1}})", false, lim);
  ignored = r.ignored;
  std::sort(ignored.begin(), ignored.end());
  EXPECT_EQ(ignored, (std::vector<std::string>{"best_of", "bogus", "stream_options.foo"}));
  // A field of the other endpoint too (echo in a chat, messages in a completion).
  r = parse_request(R"({"prompt":"y","messages":[{"role":"user","content":"x"}]})", false, lim);
  EXPECT_EQ(r.prompt, "y");
  EXPECT_EQ(r.ignored, (std::vector<std::string>{"messages"}));
  r = parse_request(R"({"prompt":"y","echo":true,"messages":[{"role":"user","content":"x"}]})", true, lim);
  EXPECT_FALSE(r.echo);
  EXPECT_EQ(r.ignored, (std::vector<std::string>{"echo", "prompt"}));
}

TEST(OpenAiRequest, TokenizeDetokenizeAndTheApiKey) {
  ApiLimits lim;
  TokenizeRequest t = parse_tokenize(R"({"prompt":"hi","model":"m","x":1})", lim);
  EXPECT_EQ(t.prompt, "hi");
  EXPECT_EQ(t.ignored, (std::vector<std::string>{"x"}));
  t = parse_tokenize(R"({"messages":[{"role":"user","content":"a"}],"add_generation_prompt":false})", lim);
  EXPECT_EQ(t.messages.size(), 1u);
  EXPECT_FALSE(t.add_generation_prompt);
  DetokenizeRequest d = parse_detokenize(R"({"tokens":[1,2,3]})", lim);
  EXPECT_EQ(d.tokens, (std::vector<int32_t>{1, 2, 3}));
  const std::vector<std::tuple<std::string, bool, std::string>> bad = {
      {"{", true, ""},
      {R"({})", true, "prompt"},
      {R"({"prompt":5})", true, "prompt"},
      {R"({"prompt":"a","messages":[{"role":"user","content":"a"}]})", true, "prompt"},
      {R"({"messages":[{"role":"robot","content":"a"}]})", true, "messages[0].role"},
      {R"({"prompt":"a","add_special_tokens":1})", true, "add_special_tokens"},
      {R"({})", false, "tokens"},
      {R"({"tokens":"1 2"})", false, "tokens"},
      {R"({"tokens":[1,-2]})", false, "tokens[1]"},
      {R"({"tokens":[1,2.5]})", false, "tokens[1]"},
  };
  for (const auto& [body, tok, param] : bad) {
    try {
      if (tok) {
        parse_tokenize(body, lim);
      } else {
        parse_detokenize(body, lim);
      }
      ADD_FAILURE() << "accepted " << body;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_EQ(e.param, param) << body << ": " << e.what();
    }
  }
  EXPECT_TRUE(bearer_matches("Bearer s3cret", "s3cret"));
  EXPECT_TRUE(bearer_matches("bearer  s3cret ", "s3cret"));
  EXPECT_FALSE(bearer_matches("Bearer s3cre", "s3cret"));
  EXPECT_FALSE(bearer_matches("Bearer s3cretx", "s3cret"));
  EXPECT_FALSE(bearer_matches("Basic s3cret", "s3cret"));
  EXPECT_FALSE(bearer_matches("s3cret", "s3cret"));
  EXPECT_FALSE(bearer_matches("", "s3cret"));
  EXPECT_FALSE(bearer_matches("Bearer ", ""));
}

TEST(OpenAiRequest, RefusalsNameTheField) {
  ApiLimits lim;
  lim.max_tokens = 100;
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"{not json", ""},
      {"[1]", ""},
      {R"({"prompt":"x","max_tokens":"5"})", "max_tokens"},
      {R"({"prompt":"x","max_tokens":-1})", "max_tokens"},
      {R"({"prompt":"x","max_tokens":101})", "max_tokens"},
      {R"({"prompt":"x","max_tokens":2.5})", "max_tokens"},
      {R"({"prompt":"x","temperature":2.5})", "temperature"},
      {R"({"prompt":"x","top_p":0})", "top_p"},
      {R"({"prompt":"x","top_k":-2})", "top_k"},
      {R"({"prompt":"x","n":0})", "n"},
      {R"({"prompt":"x","stream":"yes"})", "stream"},
      {R"({"prompt":"x","stop":["a",1]})", "stop[1]"},
      {R"({"prompt":"x","stop":["","b"]})", "stop"},
      {R"({"prompt":"x","stream_options":{"include_usage":true}})", "stream_options"},
      {R"({"prompt":"x","presence_penalty":2.5})", "presence_penalty"},
      {R"({"prompt":"x","frequency_penalty":"1"})", "frequency_penalty"},
      {R"({"prompt":"x","logit_bias":[1]})", "logit_bias"},
      {R"({"prompt":"x","logit_bias":{"a7":1}})", "logit_bias"},
      {R"({"prompt":"x","logit_bias":{"7":100.5}})", "logit_bias.7"},
      {R"({"prompt":"x","logit_bias":{"7":1,"07":2}})", "logit_bias"},
      {R"({"prompt":"x","logit_bias":{"99999999999":1}})", "logit_bias"},
      {R"({"prompt":"x","logprobs":true})", "logprobs"},
      {R"({"prompt":"x","logprobs":21})", "logprobs"},
      {R"({"prompt":"x","echo":1})", "echo"},
      {R"({"prompt":"x","response_format":"json"})", "response_format"},
      {R"({"prompt":"x","response_format":{"type":"xml"}})", "response_format.type"},
      {R"({"prompt":"x","response_format":{}})", "response_format.type"},
      {R"({"prompt":"x","response_format":{"type":"json_schema"}})", "response_format.json_schema"},
      {R"({"prompt":"x","response_format":{"type":"json_schema","json_schema":{"name":1,"schema":{}}}})",
       "response_format.json_schema.name"},
      {R"({"prompt":"x","response_format":{"type":"json_schema","json_schema":{"schema":)"
       R"({"type":"string","pattern":"a+"}}}})", "response_format.json_schema.schema"},
      {R"({"prompt":"x","response_format":{"type":"json_schema","json_schema":{"schema":{"type":"frog"}}}})",
       "response_format.json_schema.schema"},
      {R"({"prompt":[1,-1]})", "prompt[1]"},
      {R"({"prompt":{"a":1}})", "prompt"},
      {R"({"max_tokens":3})", "prompt"},
  };
  // Completions take max_tokens 0 (scoring the prompt); chat does not.
  EXPECT_EQ(*parse_request(R"({"prompt":"x","max_tokens":0})", false, lim).max_tokens, 0);
  try {
    parse_request(R"({"messages":[{"role":"user","content":"x"}],"max_tokens":0})", true, lim);
    ADD_FAILURE() << "chat accepted max_tokens 0";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param, "max_tokens");
  }
  for (const auto& [body, param] : bad) {
    try {
      parse_request(body, false, lim);
      ADD_FAILURE() << "accepted " << body;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400) << body;
      EXPECT_EQ(e.param, param) << body << ": " << e.what();
    }
  }
  const std::vector<std::pair<std::string, std::string>> bad_chat = {
      {R"({"messages":[]})", "messages"},
      {R"({"messages":[{"role":"robot","content":"x"}]})", "messages[0].role"},
      {R"({"messages":[{"role":"user"}]})", "messages[0].content"},
      {R"({"messages":[{"role":"user","content":"x"}],"logprobs":3})", "logprobs"},
      {R"({"messages":[{"role":"user","content":"x"}],"top_logprobs":3})", "top_logprobs"},
      {R"({"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":21})", "top_logprobs"},
      {R"({"messages":[{"role":"user","content":"x"}],"max_completion_tokens":0})", "max_completion_tokens"},
      {R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})", "messages[0].content[0].type"},
  };
  for (const auto& [body, param] : bad_chat) {
    try {
      parse_request(body, true, lim);
      ADD_FAILURE() << "accepted " << body;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.param, param) << body << ": " << e.what();
    }
  }
  // The unsupported keyword is named in the message, with its place.
  try {
    parse_request(R"({"prompt":"x","response_format":{"type":"json_schema","json_schema":{"schema":)"
                  R"({"type":"object","properties":{"a":{"type":"string","format":"email"}}}}}})",
                  false, lim);
    ADD_FAILURE() << "accepted format";
  } catch (const ApiError& e) {
    EXPECT_NE(std::string(e.what()).find("\"format\""), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("/properties/a/format"), std::string::npos) << e.what();
    EXPECT_EQ(e.code, "unsupported_schema");
  }
  // The error object's shape.
  EXPECT_EQ(error_json("m", "invalid_request_error", "n", "c"),
            R"({"error":{"code":"c","message":"m","param":"n","type":"invalid_request_error"}})");
  EXPECT_EQ(error_json("m"), R"({"error":{"code":null,"message":"m","param":null,"type":"invalid_request_error"}})");
}

// ---- chat templates ----

namespace {

// Meta-Llama-3-8B-Instruct's chat_template (the fixture the recogniser must accept).
const char* const kTemplate =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";

std::string config_with(const std::string& tmpl_json) {
  return R"({"bos_token": "<|begin_of_text|>", "chat_template": )" + tmpl_json + "}";
}

void expect_llama3_rendering(const ChatTemplate& t) {
  const std::vector<ChatMessage> msgs = {
      {"system", "  You are terse.\n"}, {"user", "Hi there!"}, {"assistant", "Hello."}, {"user", "\tBye \n"}};
  EXPECT_EQ(t.render(msgs, true),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi there!<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(t.render({{"user", "x"}}, false),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nx<|eot_id|>");
}

}  // namespace

TEST(ChatTemplate, RendersLlama3Exactly) {
  expect_llama3_rendering(ChatTemplate::from_config(config_with(std::string("\"") + kTemplate + "\""), "cfg"));
  // The list form with a "default" entry.
  expect_llama3_rendering(ChatTemplate::from_config(
      config_with(std::string(R"([{"name":"tool_use","template":"x"},{"name":"default","template":")") +
                  kTemplate + "\"}]"),
      "cfg"));
}

TEST(ChatTemplate, TheRealLlama3ConfigFile) {
  const char* env = std::getenv("DIFFATTN_TOKENIZER_DATA");
  const std::string dir = env && *env ? env : DIFFATTN_TOKENIZER_DATA_DEFAULT;
  std::ifstream f(dir + "/llama3/tokenizer_config.json");
  if (!f) GTEST_SKIP() << "no tokenizer data at " << dir << " (set DIFFATTN_TOKENIZER_DATA)";
  std::stringstream ss;
  ss << f.rdbuf();
  expect_llama3_rendering(ChatTemplate::from_config(ss.str(), "llama3/tokenizer_config.json"));
}

TEST(ChatTemplate, MissingTemplatesAreClear400sAnyTemplateRenders) {
  try {
    ChatTemplate::from_config(R"({"bos_token":"<s>"})", "DIR/tokenizer_config.json");
    FAIL();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.code, "no_chat_template");
    EXPECT_NE(std::string(e.what()).find("DIR/tokenizer_config.json has no \"chat_template\""), std::string::npos);
  }
  EXPECT_THROW(ChatTemplate::from_config("{", "c"), ApiError);
  // Any template renders (the engine of src/tokenize), with the config's special tokens.
  const ChatTemplate t = ChatTemplate::from_config(
      config_with(R"("{{ bos_token }}{% for m in messages %}{{ m.role[0] }}:{{ m.content }};{% endfor %}")"), "c");
  EXPECT_EQ(t.render({{"user", "a"}, {"assistant", "b"}}, false), "<|begin_of_text|>u:a;a:b;");
  // A template that refuses a conversation: a 400 with its message, on "messages".
  const ChatTemplate strict = ChatTemplate::from_config(
      config_with(R"("{% if messages[0].role != 'user' %}{{ raise_exception('Conversations must start with a user message.') }}{% endif %}ok")"),
      "DIR/tokenizer_config.json");
  EXPECT_EQ(strict.render({{"user", "x"}}, true), "ok");
  try {
    strict.render({{"assistant", "x"}}, true);
    FAIL();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, "messages");
    EXPECT_EQ(e.code, "chat_template_error");
    EXPECT_EQ(std::string(e.what()),
              "the model's chat template refuses this conversation: Conversations must start with a user message. "
              "(DIR/tokenizer_config.json, line 1)");
  }
  // One that does not parse is not a 400 but an error naming the file (the server does not start).
  try {
    ChatTemplate::from_config(config_with(R"("{% for m in messages %}")"), "DIR/tokenizer_config.json");
    FAIL();
  } catch (const diffattn::tokenize::TemplateError& e) {
    EXPECT_EQ(e.template_name(), "DIR/tokenizer_config.json");
    EXPECT_EQ(e.kind(), diffattn::tokenize::TemplateError::Kind::kSyntax);
  }
}

// The request-head framing of src/http (tests/python/test_http_framing.py sends the same over
// sockets and checks that the connection closes with nothing after it answered).
TEST(HttpHead, FramingAsRfc9112Asks) {
  using diffattn::http::check_request_head;
  const std::string get = "GET /v1/models HTTP/1.1\r\nHost: x\r\n";
  EXPECT_EQ(check_request_head(get + "\r\n").status, 0);
  EXPECT_EQ(check_request_head("GET / HTTP/1.0\r\n\r\n").status, 0);
  EXPECT_EQ(check_request_head(get + "Content-Length: 12\r\n\r\n").status, 0);
  EXPECT_EQ(check_request_head(get + "X-A:\tv \t\r\n\r\n").status, 0);
  const std::pair<std::string, std::string> refused[] = {
      {get + "Content-Length: 1\r\nContent-Length: 2\r\n\r\n", "2 Content-Length fields"},
      {get + "Content-Length: 1\r\nContent-Length: 1\r\n\r\n", "2 Content-Length fields"},
      {get + "Content-Length: 1,1\r\n\r\n", "digits only"},
      {get + "Transfer-Encoding : chunked\r\n\r\n", "whitespace between the header name \"Transfer-Encoding\""},
      {get + "Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n", "both Transfer-Encoding and Content-Length"},
      {get + "Transfer-Encoding: chunked, gzip\r\n\r\n", "does not end in chunked"},
      {get + "X-A: a" + std::string(1, '\0') + "b\r\n\r\n", "control byte \\x00"},
      {get + "X-A: a\r\n b\r\n\r\n", "line folding"},
      {"GET / HTTP/1.1\nHost: x\r\n\r\n", "bare LF"},
      {get + "X-A: a\rb\r\n\r\n", "bare CR"},
      {"GET / HTTP/1.1\r\n\r\n", "must have a Host"},
      {get + "Host: y\r\n\r\n", "2 Host fields"},
      {"GET  / HTTP/1.1\r\nHost: x\r\n\r\n", "one space between each"},
      {get + "\r\n\r\n", "does not end with one blank line"},
      {get, "does not end with one blank line"},
      {"GET / HTTP/1.1", "does not end with CRLF CRLF"},
  };
  for (const auto& [head, words] : refused) {
    const auto c = check_request_head(head);
    EXPECT_EQ(c.status, 400) << head;
    EXPECT_NE(c.message.find(words), std::string::npos) << head << " -> " << c.message;
  }
  EXPECT_EQ(check_request_head(get + "Transfer-Encoding: chunked\r\n\r\n").status, 411);
  EXPECT_EQ(check_request_head("GET / HTTP/2.0\r\nHost: x\r\n\r\n").status, 505);
}
