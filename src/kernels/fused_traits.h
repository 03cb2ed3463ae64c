// Tile sizes of the fused CPU kernels, in one table. Every size that shapes a loop or a buffer
// is here, with the reasoning beside it; the SIMD code (simd-inl.h) reads them.
#pragma once

#include <cstdint>

namespace diffattn::kernels::fused {

// Rows of every packed buffer are padded to a multiple of this, so the micro-kernels never see
// a partial row block (kMR below divides it on every target).
inline constexpr int64_t kRowPad = 8;
// Columns of packed buffers (head sizes D, Dv) are padded to a multiple of this: 16 floats is
// one AVX-512 vector and a whole number of AVX2 (8) and 128-bit (4) vectors.
inline constexpr int64_t kColPad = 16;

inline constexpr int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// Threads a call gets: no more than its work keeps busy. A parallel region costs a wake-up and
// a barrier (microseconds on a quiet machine, up to milliseconds on an over-committed VM whose
// idle threads spin), so a small call runs on fewer threads, down to one.
struct Parallel {
  static constexpr double kMinFlopsPerThread = 4e6;      // forward / backward
  // Decode: K/V bytes streamed per thread when idle threads sleep (each region wakes them).
  static constexpr double kMinBytesPerThread = 1 << 20;
  // Decode when idle threads spin: K/V bytes times the query rows each key head serves (the
  // scores' and P V's work per byte: 1 for standard and V1, 2 for V2, the group size with GQA).
  // Small preset, 2 spinning threads, Model::decode_paged timed by a scratch driver: a step of
  // 4 or 8 sequences at 80 positions (655 KB / 1.3 MB a layer, one thread under the 1 MiB rule)
  // took a median 0.88x the time with this rule (17 of 18 alternating cells faster, three
  // kinds); one V1 sequence of 200 positions (410 KB) ran 2-23 % slower split over two threads,
  // which this rule keeps on one.
  static constexpr double kMinDecodeWorkPerThread = 256 << 10;
  static int threads_for(double work, double per_thread, int available) {
    const double n = work / per_thread;
    return n >= available ? available : (n < 1 ? 1 : static_cast<int>(n));
  }
};

struct FwdTiles {
  // Query rows an item stacks over all its row sets (pairs of the group x maps): 128 rows of
  // scores (128 x kBk x 4 B = 32 KiB) and accumulators (128 x Dv) stay in L2 next to one K/V tile.
  static constexpr int64_t kRows = 128;
  static constexpr int64_t kMaxBq = 128;  // query rows per row set
  static constexpr int64_t kBk = 64;      // keys per K/V tile: 4 AVX-512 vectors of scores
  static_assert(kRows % kRowPad == 0 && kMaxBq % kRowPad == 0);
};

struct BwdTiles {
  static constexpr int64_t kBk = 64;  // keys per item: dK, dV of the block stay in L1/L2
  static constexpr int64_t kBq = 64;  // query rows per step of the inner loop
  static_assert(kBq % kRowPad == 0 && kBk % kRowPad == 0);
};

struct DecodeTiles {
  // attention_fwd takes the decode path for at most this many query rows against at least
  // kMinKeys keys: there the tiled forward has too few query blocks to feed the threads.
  static constexpr int64_t kMaxRows = 4;
  static constexpr int64_t kMinKeys = 256;
  // Keys per tile inside a chunk: one AVX-512 vector of scores per query row (32 and 64 were
  // slower: the tile stays in L1 and the next one is asked for a tile ahead).
  static constexpr int64_t kBk = 16;
  static constexpr int64_t kMinChunk = 512;   // keys per split, at least
  static constexpr int64_t kSplitsPerThread = 4;  // splits per thread, for load balance
  static_assert(kMinChunk % kBk == 0);
};

// Register blocking of the micro-kernel C(MR x NV vectors) += A(MR x k) B(k x NV vectors):
// MR broadcasts and NV loads feed MR*NV FMAs per step of k. 32 vector registers (AVX-512):
// 4 x 4 = 16 accumulators, enough independent chains to cover FMA latency on two ports, and
// 8 loads per 16 FMAs. Measured on the development machine (Ice Lake server, one thread, CPU
// time of the T=4096 causal V1 forward and backward): 4 x 4 took 0.85-0.95x the time of
// 8 x 2 (10 loads per 16 FMAs). 16 registers (AVX2, emulated): 4 x 2 = 8 accumulators.
template <int kRegisters>
struct MicroTile;
template <>
struct MicroTile<32> {
  static constexpr int kMR = 4, kNV = 4;
};
template <>
struct MicroTile<16> {
  static constexpr int kMR = 4, kNV = 2;
};
static_assert(kRowPad % MicroTile<32>::kMR == 0 && kRowPad % MicroTile<16>::kMR == 0);

}  // namespace diffattn::kernels::fused
