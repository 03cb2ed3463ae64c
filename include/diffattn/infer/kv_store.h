// The KV store of inference: one pool of fixed-size blocks per layer (nn::KVPool), the block
// allocator with its prefix cache, and each open sequence's block table and length. Position j
// of a sequence is row j % block_size of block table[j / block_size] in every pool. A contiguous
// cache is a store of one sequence whose one block holds its whole capacity (no allocator).
#pragma once

#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

#include "diffattn/base/dtype.h"
#include "diffattn/model/model.h"
#include "diffattn/nn/attention_layer.h"

namespace diffattn::infer {

// Fixed-size blocks of KV positions from one pool of n_blocks, with automatic prefix caching:
// a block that holds a whole block of a prompt can be registered under a key (a hash of its
// tokens chained to its prefix's key), and a later sequence whose prompt starts with the same
// tokens takes it (a reference) instead of computing it again. A block is free when nothing
// refers to it; a free registered block keeps its K/V and its key until it is needed for
// something else, the least recently used first. Not thread-safe (one thread owns a store).
class BlockAllocator {
 public:
  BlockAllocator(int64_t n_blocks, int64_t block_size);
  // Throws InvalidArgument unless n_blocks is in 1..2^30 and block_size in 1..4096.
  static void check_sizes(int64_t n_blocks, int64_t block_size);
  int64_t block_size() const { return block_size_; }
  int64_t total() const { return static_cast<int64_t>(ref_.size()); }
  // Blocks that allocate() can hand out: never used or released, and cached ones nothing refers to.
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size() + lru_.size()); }
  // Registered blocks (whether referred to or not).
  int64_t cached_blocks() const { return static_cast<int64_t>(by_key_.size()); }
  // Blocks needed for `positions` KV positions.
  int64_t blocks_for(int64_t positions) const;
  // Appends n block ids to table, or returns false (and takes nothing) if fewer than n are free.
  // Blocks never registered go first, then registered ones nothing refers to, least recently
  // used first (their keys are forgotten).
  bool allocate(int64_t n, std::vector<int32_t>& table);
  // Drops a reference to every block of table and clears it; a block not allocated, or given
  // twice, is an InvalidArgument (and nothing is released).
  void release(std::vector<int32_t>& table);

  // The key of a block of tokens (block_size of them) after a prefix whose key is `parent`
  // (kRootKey for the first block).
  static constexpr uint64_t kRootKey = 0x6a09e667f3bcc908ull;
  uint64_t key_of(uint64_t parent, const int32_t* tokens) const;
  // The block registered under key with exactly these tokens, a reference taken; -1 if none.
  int32_t lookup(uint64_t key, const int32_t* tokens);
  // Registers allocated block b as holding `tokens` after the prefix whose key is `parent`, under
  // key_of(parent, tokens) (for lookup) and under parent (for lookup_partial); false (nothing
  // changes) when that key already has a block.
  bool register_block(int32_t b, uint64_t parent, const int32_t* tokens);
  // Of the blocks registered after the prefix whose key is `parent`, the one whose tokens begin
  // with the longest run of tokens[0, n) (n < block_size), with a reference taken (give it back
  // with release()); -1 when none begins with tokens[0]. matched: the run's length. A prompt
  // that ends inside a block copies those K/V rows instead of computing them again.
  int32_t lookup_partial(uint64_t parent, const int32_t* tokens, int64_t n, int64_t& matched);

 private:
  void forget(int32_t b);
  int64_t block_size_;
  std::vector<int32_t> free_;  // a stack: the most recently freed block is reused first
  std::vector<int32_t> ref_;   // references to each block (0: free or cached-and-free)
  struct Cached {
    uint64_t key = 0, parent = 0;
    std::vector<int32_t> tokens;
    std::list<int32_t>::iterator lru;  // valid while free (ref 0)
  };
  std::unordered_map<int32_t, Cached> cached_;  // the registered blocks
  std::unordered_map<uint64_t, int32_t> by_key_;
  std::unordered_multimap<uint64_t, int32_t> by_parent_;  // the registered blocks by parent key
  std::list<int32_t> lru_;  // registered blocks nothing refers to, least recently used first
};

// The pools of every layer of a model, their allocator and the open sequences. A sequence is
// opened (an id), given blocks (its table, through blocks()), filled by Session::decode (which
// advances its length) and closed (its blocks released). Not thread-safe.
class KvStore {
 public:
  // n_blocks blocks of block_size positions per layer, stored as kv_dtype (F32, or BF16/F16:
  // half the bytes, rounded once when written, read with float32 arithmetic). Throws
  // InvalidArgument for sizes out of BlockAllocator's range or a store that would not fit in
  // the machine's memory, before anything is allocated.
  KvStore(const model::Model& m, int64_t n_blocks, int64_t block_size, DType kv_dtype = DType::F32);
  // A contiguous store: one sequence (id 0, open from the start, its table {0}) of up to
  // `capacity` positions (at most the model's max_seq_len) in a pool of one block of that many
  // positions per layer: one generation's cache, run by the same paged attention as a paged
  // store's. It has no allocator (blocks() throws) and holds no other sequence.
  struct Contiguous {
    int64_t capacity = 0;
  };
  KvStore(const model::Model& m, Contiguous c, DType kv_dtype = DType::F32);
  KvStore(const KvStore&) = delete;
  KvStore& operator=(const KvStore&) = delete;

  // What a recurrent model (ModelConfig::recurrent(), SambaY) keeps per sequence besides the
  // K/V of its one full-attention layer: per Mamba layer the conv inputs (K - 1, E) and the scan
  // state (E, N), float32, and per sliding-window layer a ring of W positions (kv_dtype).
  // Allocated when the sequence opens, zero.
  struct Recurrent {
    std::vector<float> conv, ssm;      // (mamba layers, K - 1, E), (mamba layers, E, N)
    std::vector<nn::KVCache> rings;    // (window layers) B = 1, capacity W
  };
  struct Seq {
    std::vector<int32_t> table;  // block ids, the same in every pool
    int64_t len = 0;             // positions holding K/V (rows [0, len) of the table's blocks)
    Recurrent rec;               // recurrent models only
  };
  // A new sequence with no blocks and no positions: the lowest free id (a contiguous store:
  // InvalidArgument, its one sequence is always open).
  int32_t open();
  // Releases the sequence's blocks to the allocator and frees its id (a contiguous store's
  // sequence is emptied instead).
  void close(int32_t id);
  bool is_open(int32_t id) const;
  // An open sequence (throws InvalidArgument naming the id otherwise).
  Seq& seq(int32_t id);
  const Seq& seq(int32_t id) const;

  // Positions the sequence can hold: its table's blocks, or the contiguous capacity.
  int64_t capacity(int32_t id) const;

  bool contiguous() const { return contiguous_; }
  BlockAllocator& blocks();
  const BlockAllocator& blocks() const;
  std::vector<nn::KVPool>& pools() { return pools_; }  // one per layer with K/V
  // Copies positions [0, n) of block src to block dst in every layer's pool (a paged store;
  // both blocks allocated, n <= block_size).
  void copy_rows(int32_t src, int32_t dst, int64_t n);
  // Positions per block (a contiguous store: its capacity).
  int64_t block_size() const { return pools_.empty() ? 0 : pools_[0].block_size; }
  // The layers with K/V in the store: every layer, or a recurrent model's one full-attention
  // layer (SambaY's YOCO layer, whose keys and values its cross layers read).
  static int64_t kv_layers(const model::ModelConfig& cfg) { return cfg.recurrent() ? 1 : cfg.n_layers; }
  // Bytes one sequence of `positions` positions holds in a store of kv_dtype: its K/V, and a
  // recurrent model's state (allocated whole when it opens).
  static double sequence_bytes(const model::ModelConfig& cfg, int64_t positions, DType kv_dtype);
  // The bytes sequence id's recurrent state holds (0 for other models): what was allocated.
  int64_t recurrent_bytes(int32_t id) const;
  int64_t n_layers() const { return static_cast<int64_t>(pools_.size()); }
  DType kv_dtype() const { return kv_dtype_; }

 private:
  void reset_recurrent(Seq& s);
  const model::ModelConfig* cfg_ = nullptr;
  DType kv_dtype_;
  // The pools first: a pool that cannot fit is refused (with its size) before anything else.
  std::vector<nn::KVPool> pools_;  // one per layer, (n_blocks, block_size, ...) each
  std::optional<BlockAllocator> alloc_;  // paged stores only
  bool contiguous_ = false;
  std::vector<Seq> seqs_;
  std::vector<uint8_t> open_;  // (seqs_.size()) 1: id in use
};

}  // namespace diffattn::infer
