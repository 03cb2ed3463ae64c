// The paged KV store (kv_store.h): the block allocator with its prefix cache, the pools of
// every layer and the open sequences' tables.
#include "diffattn/infer/kv_store.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "diffattn/base/error.h"
#include "diffattn/base/memory.h"

namespace diffattn::infer {

// ---- BlockAllocator ----

BlockAllocator::BlockAllocator(int64_t n_blocks, int64_t block_size) : block_size_(block_size) {
  check_sizes(n_blocks, block_size);
  ref_.assign(static_cast<size_t>(n_blocks), 0);
  free_.reserve(static_cast<size_t>(n_blocks));
  for (int64_t i = n_blocks - 1; i >= 0; --i) free_.push_back(static_cast<int32_t>(i));
}

void BlockAllocator::check_sizes(int64_t n_blocks, int64_t block_size) {
  if (n_blocks < 1 || n_blocks > (int64_t{1} << 30)) {
    throw InvalidArgument("KV pool: the number of blocks must be in 1..2^30, got " +
                          std::to_string(n_blocks));
  }
  if (block_size < 1 || block_size > 4096) {
    throw InvalidArgument("KV pool: the block size must be in 1..4096 positions, got " +
                          std::to_string(block_size));
  }
}

int64_t BlockAllocator::blocks_for(int64_t positions) const {
  return positions <= 0 ? 0 : (positions + block_size_ - 1) / block_size_;
}

void BlockAllocator::forget(int32_t b) {
  const auto it = cached_.find(b);
  if (it == cached_.end()) return;
  by_key_.erase(it->second.key);
  auto [lo, hi] = by_parent_.equal_range(it->second.parent);
  for (auto p = lo; p != hi; ++p) {
    if (p->second == b) {
      by_parent_.erase(p);
      break;
    }
  }
  cached_.erase(it);
}

bool BlockAllocator::allocate(int64_t n, std::vector<int32_t>& table) {
  if (n < 0) throw InvalidArgument("KV pool: cannot allocate " + std::to_string(n) + " blocks");
  if (n > free_blocks()) return false;
  for (int64_t i = 0; i < n; ++i) {
    int32_t b;
    if (!free_.empty()) {
      b = free_.back();
      free_.pop_back();
    } else {
      b = lru_.front();  // the least recently used cached block: its K/V is overwritten
      lru_.pop_front();
      forget(b);
    }
    ref_[static_cast<size_t>(b)] = 1;
    table.push_back(b);
  }
  return true;
}

void BlockAllocator::release(std::vector<int32_t>& table) {
  std::vector<int32_t> sorted = table;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    const int32_t b = sorted[i];
    if (b < 0 || b >= total() || ref_[static_cast<size_t>(b)] == 0 ||
        (i > 0 && sorted[i - 1] == b)) {
      throw InvalidArgument("KV pool: block " + std::to_string(b) +
                            " is not allocated (or is in the table twice)");
    }
  }
  for (const int32_t b : table) {
    if (--ref_[static_cast<size_t>(b)] > 0) continue;
    const auto it = cached_.find(b);
    if (it != cached_.end()) {
      it->second.lru = lru_.insert(lru_.end(), b);  // kept, most recently used last
    } else {
      free_.push_back(b);
    }
  }
  table.clear();
}

uint64_t BlockAllocator::key_of(uint64_t parent, const int32_t* tokens) const {
  // FNV-1a over the parent's key and the tokens, then a final mix (splitmix64's).
  uint64_t h = 0xcbf29ce484222325ull;
  const auto eat = [&h](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 0x100000001b3ull;
    }
  };
  eat(parent);
  for (int64_t i = 0; i < block_size_; ++i) eat(static_cast<uint32_t>(tokens[i]));
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

int32_t BlockAllocator::lookup(uint64_t key, const int32_t* tokens) {
  const auto it = by_key_.find(key);
  if (it == by_key_.end()) return -1;
  const int32_t b = it->second;
  Cached& c = cached_.at(b);
  if (!std::equal(c.tokens.begin(), c.tokens.end(), tokens)) return -1;  // a collision of keys
  if (ref_[static_cast<size_t>(b)]++ == 0) lru_.erase(c.lru);
  return b;
}

int32_t BlockAllocator::lookup_partial(uint64_t parent, const int32_t* tokens, int64_t n,
                                       int64_t& matched) {
  matched = 0;
  if (n <= 0) return -1;
  if (n >= block_size_) {
    throw InvalidArgument("KV pool: a partial block holds fewer than " +
                          std::to_string(block_size_) + " tokens, not " + std::to_string(n));
  }
  int32_t best = -1;
  auto [lo, hi] = by_parent_.equal_range(parent);
  for (auto p = lo; p != hi; ++p) {
    const std::vector<int32_t>& t = cached_.at(p->second).tokens;
    int64_t k = 0;
    while (k < n && t[static_cast<size_t>(k)] == tokens[k]) ++k;
    if (k > matched) {
      matched = k;
      best = p->second;
    }
  }
  if (best >= 0 && ref_[static_cast<size_t>(best)]++ == 0) lru_.erase(cached_.at(best).lru);
  return best;
}

bool BlockAllocator::register_block(int32_t b, uint64_t parent, const int32_t* tokens) {
  if (b < 0 || b >= total() || ref_[static_cast<size_t>(b)] == 0) {
    throw InvalidArgument("KV pool: cannot register block " + std::to_string(b) + ": not allocated");
  }
  const uint64_t key = key_of(parent, tokens);
  if (cached_.count(b) != 0 || by_key_.count(key) != 0) return false;
  Cached& c = cached_[b];
  c.key = key;
  c.parent = parent;
  c.tokens.assign(tokens, tokens + block_size_);
  by_key_.emplace(key, b);
  by_parent_.emplace(parent, b);
  return true;
}

// ---- KvStore ----

namespace {

// The pools of every layer, after the sizes are checked and the whole store is known to fit.
std::vector<nn::KVPool> make_pools(const model::Model& m, int64_t n_blocks, int64_t block_size,
                                   DType kv_dtype) {
  const model::ModelConfig& cfg = m.config();
  const int64_t n = KvStore::kv_layers(cfg), first = cfg.recurrent() ? cfg.yoco_layer() : 0;
  double bytes = 0;
  for (int64_t l = first; l < first + n; ++l) {
    const nn::AttnLayerShape s = cfg.attn_shape(l);
    bytes += static_cast<double>(n_blocks) * static_cast<double>(block_size) *
             static_cast<double>(s.n_k() + s.n_v()) * static_cast<double>(dtype_size(kv_dtype));
  }
  check_fits_in_memory(bytes, "the KV pool (" + std::to_string(n_blocks) + " blocks of " +
                                  std::to_string(block_size) + " positions, " +
                                  std::to_string(n) + " layers)");
  std::vector<nn::KVPool> pools(static_cast<size_t>(n));
  for (int64_t l = 0; l < n; ++l) {
    pools[static_cast<size_t>(l)].reset(cfg.attn_shape(first + l), n_blocks, block_size, kv_dtype);
  }
  return pools;
}

// The allocator's sizes checked before the pools are made.
int64_t checked_blocks(int64_t n_blocks, int64_t block_size) {
  BlockAllocator::check_sizes(n_blocks, block_size);
  return n_blocks;
}

// A contiguous store's capacity: at least 1, at most the model's context.
int64_t contiguous_capacity(const model::ModelConfig& cfg, int64_t capacity) {
  if (capacity < 1) {
    throw InvalidArgument("KV store: a contiguous cache needs a capacity >= 1, got " +
                          std::to_string(capacity));
  }
  return std::min(capacity, cfg.max_seq_len);
}

}  // namespace

KvStore::KvStore(const model::Model& m, int64_t n_blocks, int64_t block_size, DType kv_dtype)
    : cfg_(&m.config()), kv_dtype_(kv_dtype),
      pools_(make_pools(m, checked_blocks(n_blocks, block_size), block_size, kv_dtype)),
      alloc_(std::in_place, n_blocks, block_size) {}

double KvStore::sequence_bytes(const model::ModelConfig& cfg, int64_t positions, DType kv_dtype) {
  const double es = static_cast<double>(dtype_size(kv_dtype)), n = static_cast<double>(positions);
  double bytes = 0;
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    const model::LayerKind k = cfg.layer_kind(l);
    if (k == model::LayerKind::Mamba) {
      bytes += 4.0 * static_cast<double>(cfg.mamba_inner()) *
               static_cast<double>(cfg.sambay.d_conv - 1 + cfg.sambay.d_state);
      continue;
    }
    if (k == model::LayerKind::Gmu || k == model::LayerKind::CrossAttention) continue;  // no state of their own
    const nn::AttnLayerShape s = cfg.attn_shape(l);
    const double rows = k == model::LayerKind::SlidingAttention ? static_cast<double>(cfg.sambay.window) : n;
    bytes += rows * static_cast<double>(s.n_k() + s.n_v()) * es;
  }
  return bytes;
}

int64_t KvStore::recurrent_bytes(int32_t id) const {
  const Recurrent& r = seq(id).rec;
  int64_t b = static_cast<int64_t>(sizeof(float) * (r.conv.size() + r.ssm.size()));
  for (const nn::KVCache& c : r.rings) {
    b += static_cast<int64_t>(c.k.size() + c.v.size());
  }
  return b;
}

void KvStore::reset_recurrent(Seq& s) {
  if (!cfg_ || !cfg_->recurrent()) return;
  const model::ModelConfig& c = *cfg_;
  int64_t n_mamba = 0, n_window = 0;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    n_mamba += c.layer_kind(l) == model::LayerKind::Mamba;
    n_window += c.layer_kind(l) == model::LayerKind::SlidingAttention;
  }
  const int64_t E = c.mamba_inner();
  const double bytes = sequence_bytes(c, 0, kv_dtype_);
  check_fits_in_memory(bytes, "a sequence's recurrent state (" + std::to_string(n_mamba) +
                                  " Mamba layers, " + std::to_string(n_window) +
                                  " sliding windows of " + std::to_string(c.sambay.window) + ")");
  s.rec.conv.assign(static_cast<size_t>(n_mamba * (c.sambay.d_conv - 1) * E), 0.0f);
  s.rec.ssm.assign(static_cast<size_t>(n_mamba * E * c.sambay.d_state), 0.0f);
  s.rec.rings.resize(static_cast<size_t>(n_window));
  int64_t i = 0;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    if (c.layer_kind(l) != model::LayerKind::SlidingAttention) continue;
    // positions are always written before they are read: a ring's contents need no zeroing
    nn::KVCache& r = s.rec.rings[static_cast<size_t>(i++)];
    if (r.capacity != c.sambay.window || r.kv_dtype != kv_dtype_) {
      r.reset(c.attn_shape(l), 1, c.sambay.window, kv_dtype_);
    }
    r.len = 0;
  }
}

KvStore::KvStore(const model::Model& m, Contiguous c, DType kv_dtype)
    : cfg_(&m.config()), kv_dtype_(kv_dtype),
      pools_(make_pools(m, 1, contiguous_capacity(m.config(), c.capacity), kv_dtype)),
      contiguous_(true) {
  open_.assign(1, 1);
  seqs_.emplace_back();
  seqs_.back().table.assign(1, 0);  // the one block
  reset_recurrent(seqs_.back());
}

BlockAllocator& KvStore::blocks() {
  if (!alloc_) throw InvalidArgument("KV store: a contiguous cache has no blocks");
  return *alloc_;
}

const BlockAllocator& KvStore::blocks() const { return const_cast<KvStore*>(this)->blocks(); }

void KvStore::copy_rows(int32_t src, int32_t dst, int64_t n) {
  const BlockAllocator& a = blocks();
  const int64_t bs = a.block_size();
  if (src < 0 || dst < 0 || src >= a.total() || dst >= a.total() || n < 0 || n > bs) {
    throw InvalidArgument("KV store: cannot copy " + std::to_string(n) + " positions from block " +
                          std::to_string(src) + " to block " + std::to_string(dst) + " (" +
                          std::to_string(a.total()) + " blocks of " + std::to_string(bs) + ")");
  }
  for (nn::KVPool& p : pools_) {
    const size_t es = dtype_size(p.kv_dtype);
    std::memcpy(p.k_at(static_cast<int64_t>(dst) * bs * p.n_k), p.k_at(static_cast<int64_t>(src) * bs * p.n_k),
                es * static_cast<size_t>(n * p.n_k));
    std::memcpy(p.v_at(static_cast<int64_t>(dst) * bs * p.n_v), p.v_at(static_cast<int64_t>(src) * bs * p.n_v),
                es * static_cast<size_t>(n * p.n_v));
  }
}

int64_t KvStore::capacity(int32_t id) const {
  return static_cast<int64_t>(seq(id).table.size()) * block_size();
}

int32_t KvStore::open() {
  if (contiguous()) throw InvalidArgument("KV store: a contiguous cache holds one sequence (id 0)");
  const auto it = std::find(open_.begin(), open_.end(), uint8_t{0});
  const size_t id = static_cast<size_t>(it - open_.begin());
  if (id == open_.size()) {
    open_.push_back(0);
    seqs_.emplace_back();
  }
  seqs_[id].table.clear();
  seqs_[id].len = 0;
  reset_recurrent(seqs_[id]);  // before the id counts as open: a refusal leaves it closed
  open_[id] = 1;
  return static_cast<int32_t>(id);
}

bool KvStore::is_open(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < open_.size() && open_[static_cast<size_t>(id)] != 0;
}

KvStore::Seq& KvStore::seq(int32_t id) {
  if (!is_open(id)) {
    throw InvalidArgument("KV store: sequence " + std::to_string(id) + " is not open");
  }
  return seqs_[static_cast<size_t>(id)];
}

const KvStore::Seq& KvStore::seq(int32_t id) const {
  return const_cast<KvStore*>(this)->seq(id);
}

void KvStore::close(int32_t id) {
  Seq& s = seq(id);
  if (contiguous()) {
    s.len = 0;
    reset_recurrent(s);
    return;
  }
  alloc_->release(s.table);
  s.len = 0;
  s.rec = Recurrent{};  // its memory back now, not when the id is reused
  open_[static_cast<size_t>(id)] = 0;
}

}  // namespace diffattn::infer
