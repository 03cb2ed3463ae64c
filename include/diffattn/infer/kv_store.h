// The paged KV store of inference: one pool of fixed-size blocks per layer (nn::KVPool), the
// block allocator with its prefix cache, and each open sequence's block table and length.
// Position j of a sequence is row j % block_size of block table[j / block_size] in every pool.
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
  // Registers allocated block b as holding `tokens` under key; false (nothing changes) when the
  // key already has a block.
  bool register_block(int32_t b, uint64_t key, const int32_t* tokens);

 private:
  void forget(int32_t b);
  int64_t block_size_;
  std::vector<int32_t> free_;  // a stack: the most recently freed block is reused first
  std::vector<int32_t> ref_;   // references to each block (0: free or cached-and-free)
  struct Cached {
    uint64_t key = 0;
    std::vector<int32_t> tokens;
    std::list<int32_t>::iterator lru;  // valid while free (ref 0)
  };
  std::unordered_map<int32_t, Cached> cached_;  // the registered blocks
  std::unordered_map<uint64_t, int32_t> by_key_;
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
  KvStore(const Model& m, int64_t n_blocks, int64_t block_size, DType kv_dtype = DType::F32);
  KvStore(const KvStore&) = delete;
  KvStore& operator=(const KvStore&) = delete;

  struct Seq {
    std::vector<int32_t> table;  // block ids, the same in every pool
    int64_t len = 0;             // positions holding K/V (rows [0, len) of the table's blocks)
  };
  // A new sequence with no blocks and no positions: the lowest free id.
  int32_t open();
  // Releases the sequence's blocks to the allocator and frees its id.
  void close(int32_t id);
  bool is_open(int32_t id) const;
  // An open sequence (throws InvalidArgument naming the id otherwise).
  Seq& seq(int32_t id);
  const Seq& seq(int32_t id) const;

  BlockAllocator& blocks() { return alloc_; }
  const BlockAllocator& blocks() const { return alloc_; }
  std::vector<nn::KVPool>& pools() { return pools_; }
  int64_t block_size() const { return alloc_.block_size(); }
  DType kv_dtype() const { return kv_dtype_; }

 private:
  DType kv_dtype_;
  // The pools first: a pool that cannot fit is refused (with its size) before anything else.
  std::vector<nn::KVPool> pools_;  // one per layer, (n_blocks, block_size, ...) each
  BlockAllocator alloc_;
  std::vector<Seq> seqs_;
  std::vector<uint8_t> open_;  // (seqs_.size()) 1: id in use
};

}  // namespace diffattn::infer
