// Phi-4-mini-flash (the SambaY hybrid, docs/models/phi4flash.md) in the inference engine: the
// per-sequence state after N decode steps equals a fresh prefill of N tokens (Mamba conv and
// scan states, the sliding-window rings, the YOCO keys/values), prompt chunks across the
// window's edge equal one chunk, a batched decode of sequences at different lengths equals each
// alone, the state's bytes are what KvStore::sequence_bytes says. The logits against the
// independent PyTorch reference: tests/python/test_phi4flash_engine.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "diffattn/infer/session.h"
#include "diffattn/model/model.h"
#include "diffattn/model/train_context.h"

namespace diffattn {
namespace {

struct OwnedStore : model::WeightStore {
  std::vector<std::vector<float>> data;
};

// A scaled-down config keeping the published pattern: 8 layers (Mamba 0, 2, 4 (memory), sliding
// 1, 3, full 5, GMU 6, cross 7), a window of 5.
model::ModelConfig tiny(int64_t layers = 8, int64_t window = 5) {
  model::ModelConfig c;
  c.arch = model::Arch::SambaY;
  c.attention = nn::AttnKind::DiffV1;
  c.vocab_size = 61;
  c.d_model = 32;
  c.n_layers = layers;
  c.n_heads = 2;     // 4 query heads
  c.n_kv_heads = 1;  // 2 key/value heads
  c.head_dim = 8;
  c.ffn_dim = 40;
  c.max_seq_len = 256;
  c.tie_embeddings = true;
  c.attn_bias = true;
  c.subln_eps = 1e-5f;
  c.sambay.d_state = 6;
  c.sambay.d_conv = 4;
  c.sambay.expand = 2;
  c.sambay.dt_rank = 2;
  c.sambay.window = window;
  return c;
}

model::Model random_model(const model::ModelConfig& c, uint32_t seed) {
  auto store = std::make_shared<OwnedStore>();
  std::mt19937 rng(seed);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  for (const model::TensorInfo& t : model::tensor_table(c)) {
    std::vector<float> v(static_cast<size_t>(t.numel));
    const std::string& n = t.name;
    auto ends = [&](const char* s) { return n.size() >= std::strlen(s) && n.compare(n.size() - std::strlen(s), std::strlen(s), s) == 0; };
    if (ends("A_log")) {
      for (size_t i = 0; i < v.size(); ++i) v[i] = std::log(1.0f + static_cast<float>(i % static_cast<size_t>(c.sambay.d_state)));
    } else if (ends("layernorm.weight") || ends("subln.weight")) {
      for (float& x : v) x = 1.0f + 0.1f * n01(rng);
    } else {
      const float sd = t.shape.size() >= 2 ? 1.0f / std::sqrt(static_cast<float>(t.shape.back())) : 0.1f;
      for (float& x : v) x = sd * n01(rng);
    }
    store->data.push_back(std::move(v));
    store->tensors.push_back(typed(store->data.back().data()));
  }
  store->description = "test";
  return model::Model(c, store);
}

std::vector<int32_t> tokens(int64_t n, uint32_t seed, int64_t V) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % static_cast<uint32_t>(V));
  return t;
}

double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0, s = 1e-6;
  for (size_t i = 0; i < a.size(); ++i) s = std::max(s, static_cast<double>(std::fabs(b[i])));
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, static_cast<double>(std::fabs(a[i] - b[i])));
  return m / s;
}

// The positions [0, n) of a ring (slot p % W) in order, n <= W.
std::vector<float> ring_rows(const nn::KVCache& r, int64_t len, int64_t n_k, bool keys) {
  const int64_t W = r.capacity, first = std::max<int64_t>(0, len - W);
  std::vector<float> out;
  for (int64_t p = first; p < len; ++p) {
    const auto* src = static_cast<const float*>(keys ? r.k_at((p % W) * n_k) : r.v_at((p % W) * n_k));
    out.insert(out.end(), src, src + n_k);
  }
  return out;
}

// Feeds `toks` into sequence `id` in chunks of the given sizes (cycled); returns the last logits.
std::vector<float> feed(infer::Session& s, int32_t id, const std::vector<int32_t>& toks,
                        const std::vector<int64_t>& chunks, int64_t V) {
  std::vector<float> logits(static_cast<size_t>(V));
  int64_t pos = 0, k = 0;
  while (pos < static_cast<int64_t>(toks.size())) {
    const int64_t n = std::min<int64_t>(chunks[static_cast<size_t>(k++ % chunks.size())],
                                        static_cast<int64_t>(toks.size()) - pos);
    infer::Batch b;
    b.add_chunk(toks.data() + pos, n, pos, id);
    s.decode(b, logits.data());
    pos += n;
  }
  return logits;
}

void expect_same_state(infer::KvStore& a, int32_t ia, infer::KvStore& b, int32_t ib, const model::ModelConfig& c) {
  const infer::KvStore::Seq& sa = a.seq(ia);
  const infer::KvStore::Seq& sb = b.seq(ib);
  ASSERT_EQ(sa.len, sb.len);
  EXPECT_LT(max_rel(sa.rec.conv, sb.rec.conv), 1e-5);
  EXPECT_LT(max_rel(sa.rec.ssm, sb.rec.ssm), 1e-5);
  ASSERT_EQ(sa.rec.rings.size(), sb.rec.rings.size());
  for (size_t i = 0; i < sa.rec.rings.size(); ++i) {
    const nn::AttnLayerShape s = c.attn_shape(static_cast<int64_t>(2 * i + 1));
    EXPECT_LT(max_rel(ring_rows(sa.rec.rings[i], sa.len, s.n_k(), true),
                      ring_rows(sb.rec.rings[i], sb.len, s.n_k(), true)), 1e-5);
    EXPECT_LT(max_rel(ring_rows(sa.rec.rings[i], sa.len, s.n_v(), false),
                      ring_rows(sb.rec.rings[i], sb.len, s.n_v(), false)), 1e-5);
  }
}

TEST(Phi4Flash, LayerPatternFollowsThePublishedModel) {
  const model::ModelConfig c = tiny(32, 512);
  for (int64_t l = 0; l < 32; ++l) {
    const model::LayerKind k = c.layer_kind(l);
    if (l % 2 == 0) {
      EXPECT_EQ(k, l <= 16 ? model::LayerKind::Mamba : model::LayerKind::Gmu) << l;
    } else {
      EXPECT_EQ(k, l < 16 ? model::LayerKind::SlidingAttention
                   : l == 17 ? model::LayerKind::FullAttention : model::LayerKind::CrossAttention) << l;
    }
  }
  EXPECT_EQ(c.memory_layer(), 16);
  EXPECT_EQ(c.yoco_layer(), 17);
  // lambda_init from the index in the whole stack (docs/models/phi4flash.md)
  EXPECT_NEAR(c.layer_lambda_init(1), 0.355509, 1e-6);
  EXPECT_NEAR(c.layer_lambda_init(17), 0.796342, 1e-6);
}

TEST(Phi4Flash, DecodeStateEqualsAFreshPrefill) {
  const model::ModelConfig c = tiny();
  const model::Model m = random_model(c, 3);
  const int64_t V = c.vocab_size;
  for (const int64_t n : {int64_t{3}, int64_t{5}, int64_t{6}, int64_t{14}}) {
    const std::vector<int32_t> toks = tokens(n, 7, V);
    infer::KvStore one(m, infer::KvStore::Contiguous{64});
    infer::Session s1(m, one);
    const std::vector<float> l1 = feed(s1, 0, toks, {n}, V);
    infer::KvStore paged(m, 32, 4);
    infer::Session s2(m, paged);
    const int32_t id = paged.open();
    paged.blocks().allocate(16, paged.seq(id).table);
    const std::vector<float> l2 = feed(s2, id, toks, {1}, V);  // one token at a time
    EXPECT_LT(max_rel(l1, l2), 1e-5) << n;
    expect_same_state(one, 0, paged, id, c);
    // Chunks that cross the window's edge (W = 5) in a paged store give the same.
    infer::KvStore p3(m, 32, 4);
    infer::Session s3(m, p3);
    const int32_t i3 = p3.open();
    p3.blocks().allocate(16, p3.seq(i3).table);
    const std::vector<float> l3 = feed(s3, i3, toks, {3, 4, 2, 6}, V);
    EXPECT_LT(max_rel(l1, l3), 1e-5) << n;
    expect_same_state(one, 0, p3, i3, c);
  }
}

TEST(Phi4Flash, BatchedDecodeEqualsEachSequenceAlone) {
  const model::ModelConfig c = tiny();
  const model::Model m = random_model(c, 5);
  const int64_t V = c.vocab_size;
  infer::KvStore kv(m, 64, 4);
  infer::Session s(m, kv);
  const std::vector<int64_t> lens{2, 7, 11};
  std::vector<int32_t> ids;
  std::vector<std::vector<int32_t>> seqs;
  for (size_t i = 0; i < lens.size(); ++i) {
    ids.push_back(kv.open());
    kv.blocks().allocate(8, kv.seq(ids.back()).table);
    seqs.push_back(tokens(lens[i] + 4, static_cast<uint32_t>(20 + i), V));
    feed(s, ids.back(), std::vector<int32_t>(seqs.back().begin(), seqs.back().begin() + lens[i]), {4}, V);
  }
  std::vector<float> logits(3 * static_cast<size_t>(V));
  for (int64_t step = 0; step < 4; ++step) {  // 4 batched steps, each sequence at its own length
    infer::Batch b;
    for (size_t i = 0; i < lens.size(); ++i) b.add(seqs[i][static_cast<size_t>(lens[i] + step)], lens[i] + step, ids[i], true);
    s.decode(b, logits.data());
  }
  for (size_t i = 0; i < lens.size(); ++i) {
    infer::KvStore alone(m, infer::KvStore::Contiguous{32});
    infer::Session sa(m, alone);
    const std::vector<float> want = feed(sa, 0, seqs[i], {1}, V);
    const std::vector<float> got(logits.begin() + static_cast<int64_t>(i) * V, logits.begin() + static_cast<int64_t>(i + 1) * V);
    EXPECT_LT(max_rel(got, want), 1e-5) << i;
    expect_same_state(alone, 0, kv, ids[i], c);
  }
}

TEST(Phi4Flash, StateBytesAreWhatTheStoreHolds) {
  const model::ModelConfig c = tiny();
  const model::Model m = random_model(c, 1);
  for (const DType dt : {DType::F32, DType::BF16}) {
    infer::KvStore kv(m, 8, 4, dt);
    const int32_t id = kv.open();
    const nn::AttnLayerShape s = c.attn_shape(c.yoco_layer());
    const double per_position = static_cast<double>((s.n_k() + s.n_v()) * static_cast<int64_t>(dtype_size(dt)));
    EXPECT_EQ(static_cast<double>(kv.recurrent_bytes(id)) + 12 * per_position,
              infer::KvStore::sequence_bytes(c, 12, dt));
    kv.close(id);
  }
  // Published shape: 875,520 state elements + 20,480 min(n, 512) + 2,560 n (the doc's formula)
  model::ModelConfig p = tiny(32, 512);
  p.d_model = 2560, p.n_heads = 20, p.n_kv_heads = 10, p.head_dim = 64, p.sambay.d_state = 16;
  p.sambay.dt_rank = 160;
  for (const int64_t n : {int64_t{4096}, int64_t{32768}, int64_t{131072}}) {
    const double mamba = 9.0 * 5120 * (3 + 16) * 4;  // float32
    const double kv = 2.0 * (20480.0 * 512 + 2560.0 * static_cast<double>(n));
    EXPECT_EQ(infer::KvStore::sequence_bytes(p, n, DType::BF16), mamba + kv) << n;
  }
}

TEST(Phi4Flash, TrainingAndSavingAreRefused) {
  const model::ModelConfig c = tiny();
  model::Model m = random_model(c, 2);
  const std::vector<int32_t> t = tokens(4, 1, c.vocab_size);
  model::TrainContext run(m);
  EXPECT_THROW(run.forward(t.data(), nullptr, 1, 4), InvalidArgument);
  EXPECT_THROW(run.backward(), InvalidArgument);
}

}  // namespace
}  // namespace diffattn
