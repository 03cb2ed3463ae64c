// Element types (dtype.h) and the BF16/F16 weight kernels (nn::linear_fwd / embedding_fwd with a
// TensorView): conversions against exact expectations over every 16-bit pattern, RNE ties and the
// special values (and the tensor view, base/tensor.h, with its DLPack export); the typed product against a float64 reference with a tolerance relative to
// what a plain float32 product of the same rounded weights gets wrong.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "diffattn/base/dtype.h"
#include "diffattn/base/error.h"
#include "diffattn/base/tensor.h"
#include "diffattn/kernels/runtime.h"
#include "diffattn/nn/layers.h"
#include "simd_targets.h"
#include "testing.h"

namespace diffattn {
namespace {

uint32_t bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// f16 pattern h by its definition, in double: (-1)^s 2^(e-15) (1 + m/1024), subnormals
// 2^-14 (m/1024); exp 31 is inf or NaN.
double f16_value(uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  const double mag = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  return s ? -mag : mag;
}

using testing::for_each_target;

TEST(DType, NamesAndSizes) {
  EXPECT_STREQ(dtype_name(DType::F32), "F32");
  EXPECT_STREQ(dtype_name(DType::BF16), "BF16");
  EXPECT_STREQ(dtype_name(DType::F16), "F16");
  EXPECT_EQ(dtype_size(DType::F32), 4u);
  EXPECT_EQ(dtype_size(DType::BF16), 2u);
  EXPECT_EQ(dtype_size(DType::F16), 2u);
}

TEST(DType, EveryBf16PatternRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = bf16_to_f32(static_cast<uint16_t>(h));
    ASSERT_EQ(bits(f), h << 16) << h;
    const bool nan = (h & 0x7fff) > 0x7f80;
    // A NaN comes back NaN with its sign and payload, quieted.
    ASSERT_EQ(f32_to_bf16(f), nan ? (h | 0x40) : h) << h;
  }
}

TEST(DType, EveryF16PatternWidensExactlyAndRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    const int e = (h >> 10) & 31, m = h & 1023;
    if (e == 31) {
      if (m == 0) {
        ASSERT_TRUE(std::isinf(f)) << h;
        ASSERT_EQ(std::signbit(f), (h >> 15) != 0) << h;
        ASSERT_EQ(f32_to_f16(f), h) << h;
      } else {
        // NaN: sign and payload kept, quiet bit set, both ways.
        ASSERT_EQ(bits(f), ((h & 0x8000u) << 16) | 0x7f800000u | (static_cast<uint32_t>(m) << 13) | 0x400000u) << h;
        ASSERT_EQ(f32_to_f16(f), h | 0x200) << h;
      }
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), f16_value(static_cast<uint16_t>(h))) << h;
    ASSERT_EQ(std::signbit(f), (h >> 15) != 0) << h;  // -0 stays -0
    ASSERT_EQ(f32_to_f16(f), h) << h;
  }
}

// Between consecutive finite values a < b (patterns h, h + 1 of one sign): the midpoint goes to
// the even pattern, anything above it to b, below it to a. Midpoints are exact in float32 (the
// formats have 8 and 11 significant bits).
TEST(DType, RoundsToNearestTiesToEven) {
  for (uint32_t h = 0; h < 0x7f7f; ++h) {  // bf16, positive finite pairs
    for (uint32_t sign : {0u, 0x8000u}) {
      const float a = bf16_to_f32(static_cast<uint16_t>(h | sign)), b = bf16_to_f32(static_cast<uint16_t>((h + 1) | sign));
      const float mid = static_cast<float>((static_cast<double>(a) + b) / 2);
      ASSERT_EQ(static_cast<double>(mid), (static_cast<double>(a) + b) / 2) << h;
      const uint16_t even = static_cast<uint16_t>(((h & 1) ? h + 1 : h) | sign);
      ASSERT_EQ(f32_to_bf16(mid), even) << h;
      ASSERT_EQ(f32_to_bf16(std::nextafter(mid, b)), (h + 1) | sign) << h;
      ASSERT_EQ(f32_to_bf16(std::nextafter(mid, a)), h | sign) << h;
    }
  }
  for (uint32_t h = 0; h < 0x7bff; ++h) {  // f16, positive finite pairs incl. subnormals
    for (uint32_t sign : {0u, 0x8000u}) {
      const double a = f16_value(static_cast<uint16_t>(h | sign)), b = f16_value(static_cast<uint16_t>((h + 1) | sign));
      const float mid = static_cast<float>((a + b) / 2);
      ASSERT_EQ(static_cast<double>(mid), (a + b) / 2) << h;
      const uint16_t even = static_cast<uint16_t>(((h & 1) ? h + 1 : h) | sign);
      ASSERT_EQ(f32_to_f16(mid), even) << h;
      ASSERT_EQ(f32_to_f16(std::nextafter(mid, static_cast<float>(b))), (h + 1) | sign) << h;
      ASSERT_EQ(f32_to_f16(std::nextafter(mid, static_cast<float>(a))), h | sign) << h;
    }
  }
}

TEST(DType, OverflowUnderflowAndNaN) {
  const float inf = INFINITY;
  // bf16: the largest finite is 0x7f7f; the tie between it (odd) and 2^128 goes to inf.
  EXPECT_EQ(f32_to_bf16(from_bits(0x7f7f7fffu)), 0x7f7f);
  EXPECT_EQ(f32_to_bf16(from_bits(0x7f7f8000u)), 0x7f80);
  EXPECT_EQ(f32_to_bf16(FLT_MAX), 0x7f80);
  EXPECT_EQ(f32_to_bf16(-inf), 0xff80);
  EXPECT_EQ(f32_to_bf16(from_bits(0x00000001u)), 0x0000);  // float32 subnormals round in bf16 too
  EXPECT_EQ(f32_to_bf16(from_bits(0x00018000u)), 0x0002);  // a tie, to even
  // NaN whose payload lives only in the low half: still NaN (quiet), never inf.
  EXPECT_EQ(f32_to_bf16(from_bits(0x7f800001u)), 0x7fc0);
  EXPECT_EQ(f32_to_bf16(from_bits(0xffffffffu)), 0xffff);
  // f16: 65504 largest finite, 65520 the tie with 2^16 (goes to inf), just below it stays.
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(std::nextafter(65520.0f, 0.0f)), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);
  EXPECT_EQ(f32_to_f16(-1e6f), 0xfc00);
  EXPECT_EQ(f32_to_f16(inf), 0x7c00);
  // Below the smallest subnormal 2^-24: 2^-25 is a tie with 0 (even), above it rounds to 2^-24.
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);
  EXPECT_EQ(f32_to_f16(-0x1p-25f), 0x8000);
  EXPECT_EQ(f32_to_f16(std::nextafter(0x1p-25f, 1.0f)), 0x0001);
  EXPECT_EQ(f32_to_f16(0x1.8p-24f), 0x0002);  // tie between 1 and 2 units: even
  EXPECT_EQ(f32_to_f16(FLT_MIN), 0x0000);
  // The largest subnormal rounds up into the smallest normal.
  EXPECT_EQ(f32_to_f16(std::nextafter(0x1p-14f, 0.0f)), 0x0400);
  EXPECT_EQ(f32_to_f16(from_bits(0x7f800001u)), 0x7e00);
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7c01)));
  EXPECT_TRUE(std::isnan(bf16_to_f32(0x7f81)));
}

#if defined(__FLT16_MAX__)
// The compiler's own float -> _Float16 conversion (IEEE, round to nearest even) on random float32
// patterns of every range: a second, independent oracle for f32_to_f16.
TEST(DType, F16MatchesCompilerConversion) {
  std::mt19937 rng(7);
  for (int i = 0; i < 2000000; ++i) {
    uint32_t b = rng();
    // Bias half the samples to the f16 range's exponents (2^-26 .. 2^17).
    if (i & 1) b = (b & 0x807fffffu) | ((101u + rng() % 44u) << 23);
    const float f = from_bits(b);
    if (std::isnan(f)) continue;
    const _Float16 h = static_cast<_Float16>(f);
    uint16_t hb;
    std::memcpy(&hb, &h, 2);
    ASSERT_EQ(f32_to_f16(f), hb) << std::hexfloat << f;
  }
}
#endif

// convert_to_f32 / convert_from_f32 (SIMD on this machine's target) against the scalar
// definitions, bit for bit incl. NaN payloads, from a source at an odd byte address and with
// lengths that leave a tail.
void bulk_conversions_match_scalar();

TEST(DType, BulkConversionsMatchScalar) {
  for_each_target([] { bulk_conversions_match_scalar(); });
}

void bulk_conversions_match_scalar() {
  for (DType t : {DType::BF16, DType::F16}) {
    std::vector<unsigned char> raw(2 * 65536 + 1);
    for (uint32_t h = 0; h < 65536; ++h) {
      const uint16_t v = static_cast<uint16_t>(h * 40503u);  // every pattern, shuffled
      std::memcpy(raw.data() + 1 + 2 * h, &v, 2);
    }
    for (int64_t n : {int64_t{65536}, int64_t{65535}, int64_t{7}, int64_t{1}}) {
      std::vector<float> got(static_cast<size_t>(n));
      convert_to_f32(got.data(), raw.data() + 1, t, n);
      for (int64_t i = 0; i < n; ++i) {
        uint16_t v;
        std::memcpy(&v, raw.data() + 1 + 2 * i, 2);
        const float want = t == DType::BF16 ? bf16_to_f32(v) : f16_to_f32(v);
        ASSERT_EQ(bits(got[i]), bits(want)) << dtype_name(t) << " pattern " << v;
      }
    }
    const std::vector<float> x = testing::randn(1001, 3, 1000.0f);
    std::vector<unsigned char> back(2 * x.size() + 1);
    convert_from_f32(back.data() + 1, x.data(), t, static_cast<int64_t>(x.size()));
    for (size_t i = 0; i < x.size(); ++i) {
      uint16_t v;
      std::memcpy(&v, back.data() + 1 + 2 * i, 2);
      ASSERT_EQ(v, t == DType::BF16 ? f32_to_bf16(x[i]) : f32_to_f16(x[i])) << i;
    }
  }
}

TEST(TensorView, TypedAccessRefusesTheWrongTypeAndDevice) {
  const float x[2] = {1, 2};
  EXPECT_EQ(typed(x).f32(), x);
  const uint16_t h[2] = {0, 0};
  const TensorView p{h, DType::BF16};
  EXPECT_THROW(p.f32(), InvalidArgument);
  EXPECT_EQ(p.u16(), h);
  EXPECT_THROW(typed(x).u16(), InvalidArgument);
  const TensorView on_gpu(x, DType::F32, {2}, {}, Device{DeviceType::CUDA, 0});
  EXPECT_THROW(on_gpu.f32(), InvalidArgument);
  EXPECT_THROW(Dims({1, 2, 3, 4, 5, 6, 7}), InvalidArgument);
}

TEST(TensorView, StridesNumelAndContiguity) {
  const float x[24] = {};
  const TensorView v(x, {2, 3, 4});
  EXPECT_EQ(v.effective_strides(), Dims({12, 4, 1}));
  EXPECT_EQ(v.numel(), 24);
  EXPECT_TRUE(v.contiguous());
  const TensorView t(x, {3, 2, 4}, {4, 12, 1});  // a transpose of the first two dimensions
  EXPECT_FALSE(t.contiguous());
  EXPECT_EQ(Shape(t.strides), (Shape{4, 12, 1}));
  // A zero-size dimension leaves the other strides as they would be.
  EXPECT_EQ(contiguous_strides(Dims({2, 0, 3})), Dims({3, 3, 1}));
}

// to_dlpack then from_dlpack gives the same view; the owner lives until the deleter runs.
TEST(TensorView, DLPackRoundTripKeepsTheOwnerAlive) {
  auto owner = std::make_shared<std::vector<uint16_t>>(2 * 3 * 5);
  const TensorView v(owner->data(), DType::BF16, {2, 3}, {15, 5});
  for (bool versioned : {false, true}) {
    SCOPED_TRACE(versioned);
    const long before = owner.use_count();
    dlpack::DLManagedTensor* m = nullptr;
    dlpack::DLManagedTensorVersioned* mv = nullptr;
    const dlpack::DLTensor* t = nullptr;
    if (versioned) {
      mv = to_dlpack_versioned(v, owner);
      t = &mv->dl_tensor;
      EXPECT_EQ(mv->version.major, 1u);
      EXPECT_EQ(mv->flags & dlpack::kFlagReadOnly, dlpack::kFlagReadOnly);
    } else {
      m = to_dlpack(v, owner);
      t = &m->dl_tensor;
    }
    EXPECT_EQ(owner.use_count(), before + 1);
    EXPECT_EQ(t->ndim, 2);
    EXPECT_EQ(t->dtype.code, dlpack::kCodeBfloat);
    EXPECT_EQ(t->dtype.bits, 16);
    EXPECT_EQ(t->device.device_type, 1);
    EXPECT_EQ(t->shape[1], 3);
    EXPECT_EQ(t->strides[0], 15);
    const TensorView back = from_dlpack(*t, "test");
    EXPECT_EQ(back.data, v.data);
    EXPECT_EQ(back.dtype, DType::BF16);
    EXPECT_EQ(back.shape, v.shape);
    EXPECT_EQ(back.strides, v.strides);
    if (versioned) {
      mv->deleter(mv);
    } else {
      m->deleter(m);
    }
    EXPECT_EQ(owner.use_count(), before);
  }
  // Contiguous views export their strides too (DLPack 1.0 consumers may require them).
  const float x[6] = {};
  dlpack::DLManagedTensor* m = to_dlpack(TensorView(x, {2, 3}), nullptr);
  EXPECT_EQ(m->dl_tensor.strides[0], 3);
  EXPECT_EQ(m->dl_tensor.dtype.code, dlpack::kCodeFloat);
  EXPECT_EQ(m->dl_tensor.dtype.bits, 32);
  m->deleter(m);
}

TEST(TensorView, DLPackRefusesWhatTheLibraryCannotRead) {
  const float x[4] = {};
  EXPECT_THROW(to_dlpack(typed(x), nullptr), InvalidArgument);  // no shape
  int64_t shape[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  dlpack::DLTensor t{const_cast<float*>(x), {1, 0}, 2, {dlpack::kCodeFloat, 32, 1}, shape, nullptr, 0};
  EXPECT_NO_THROW(from_dlpack(t, "x"));
  auto refuses = [&](dlpack::DLTensor bad, const std::string& words) {
    try {
      from_dlpack(bad, "x");
      ADD_FAILURE() << "accepted: " << words;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  dlpack::DLTensor b = t;
  b.dtype = {0, 32, 1};  // int32
  refuses(b, "element type");
  b = t;
  b.dtype = {dlpack::kCodeFloat, 64, 1};
  refuses(b, "element type");
  b = t;
  b.dtype.lanes = 4;
  refuses(b, "vector");
  b = t;
  b.device.device_type = 8;  // Metal
  refuses(b, "device type 8");
  b = t;
  b.ndim = 7;
  refuses(b, "7 dimensions");
  b = t;
  b.ndim = -1;
  refuses(b, "dimensions");
  b = t;
  shape[0] = -3;
  refuses(b, "negative size");
  shape[0] = int64_t{1} << 40;
  shape[1] = int64_t{1} << 40;
  refuses(b, "more elements than int64 counts");
  shape[0] = shape[1] = 1;
  b = t;
  b.shape = nullptr;
  refuses(b, "without a shape");
  // byte_offset is applied.
  b = t;
  b.byte_offset = 8;
  EXPECT_EQ(from_dlpack(b, "x").data, static_cast<const void*>(x + 2));
}

// ---- typed linear_fwd ----

struct LinearCase {
  int64_t N, C, OC;
};

// out (N, OC) at stride ldo; checks every element and that the padding columns are untouched.
void check_linear(DType t, const LinearCase& k, uint32_t seed) {
  const int64_t N = k.N, C = k.C, OC = k.OC, ldo = OC + 3;
  const std::vector<float> x = testing::randn(N * C, seed);
  const std::vector<float> w0 = testing::randn(OC * C, seed + 1, 0.05f);
  std::vector<uint16_t> wq(w0.size());
  std::vector<float> w(w0);  // the rounded weights, as float32 (F32: the weights themselves)
  if (t != DType::F32) {
    convert_from_f32(wq.data(), w0.data(), t, OC * C);
    convert_to_f32(w.data(), wq.data(), t, OC * C);
  }
  // A zero weight row: its output must be exactly 0 (the absolute floor covers only this).
  if (OC > 2) {
    std::fill(w.begin() + C, w.begin() + 2 * C, 0.0f);
    std::fill(wq.begin() + C, wq.begin() + 2 * C, uint16_t{0});
  }

  const float kPad = 12345.0f;
  std::vector<float> out(static_cast<size_t>(N * ldo), kPad);
  if (t == DType::F32) {  // the float32 product: sgemv, the few-rows kernel or sgemm by N
    nn::linear_fwd(out.data(), x.data(), w.data(), N, C, OC, ldo);
  } else {
    nn::linear_fwd(out.data(), x.data(), TensorView{wq.data(), t}, N, C, OC, ldo);
  }

  double err = 0, err32 = 0, scale = 0;
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t o = 0; o < OC; ++o) {
      double ref = 0, mag = 0;
      float naive = 0;  // plain float32, in order
      for (int64_t c = 0; c < C; ++c) {
        const double p = static_cast<double>(x[n * C + c]) * w[o * C + c];
        ref += p;
        mag += std::fabs(p);
        naive += x[n * C + c] * w[o * C + c];
      }
      err = std::max(err, std::fabs(out[n * ldo + o] - ref));
      err32 = std::max(err32, std::fabs(naive - ref));
      scale = std::max(scale, mag);
    }
    for (int64_t o = OC; o < ldo; ++o) ASSERT_EQ(out[n * ldo + o], kPad) << "padding written";
    if (OC > 2) {
      ASSERT_EQ(out[n * ldo + 1], 0.0f) << "zero weight row";
    }
  }
  // One float32 rounding of the largest sum of |terms| is the floor: a single-element output
  // can be summed exactly by the naive loop by chance.
  const double tol = 2 * err32 + scale * 0x1p-24;
  EXPECT_LE(err, tol) << dtype_name(t) << " N=" << N << " C=" << C << " OC=" << OC
                      << " naive float32 error " << err32;
}

TEST(LinearLowp, MatchesFloat64Reference) {
  std::vector<LinearCase> cases;
  // Every remainder after the full register tiles (6 input rows with AVX-512, 2 with AVX2).
  // N = 128 / 129: the last few-rows product of 16-bit weights and the first widened-panel one.
  for (int64_t N : {1, 2, 3, 4, 5, 7, 8, 9, 11, 16, 17, 32, 33, 64, 128, 129, 513}) {
    for (int64_t C : {37, 1000}) {
      for (int64_t OC : {1, 31, 130}) cases.push_back({N, C, OC});
    }
  }
  // Wider shapes where the SIMD loop dominates, and panel boundaries (128-row panels).
  for (int64_t N : {1, 3, 8, 9}) cases.push_back({N, 2048, 4097});
  cases.push_back({1, 5000, 33});  // several column blocks of the one-row kernel, and a tail
  cases.push_back({64, 2048, 300});
  cases.push_back({513, 1000, 300});
  cases.push_back({513, 2048, 257});
  uint32_t seed = 100;
  for (DType t : {DType::BF16, DType::F16, DType::F32}) {
    for (const LinearCase& k : cases) check_linear(t, k, seed += 7);
  }
}

// Every compiled target's matrix-vector kernel and widening, on shapes with vector tails.
TEST(LinearLowp, EveryTarget) {
  for_each_target([] {
    uint32_t seed = 500;
    for (DType t : {DType::BF16, DType::F16, DType::F32}) {
      for (LinearCase k : {LinearCase{1, 37, 31}, LinearCase{3, 1000, 9}, LinearCase{8, 70, 130},
                           LinearCase{9, 37, 200}, LinearCase{1, 4100, 7}, LinearCase{16, 70, 65}}) {
        check_linear(t, k, seed += 7);
      }
    }
  });
}

TEST(LinearLowp, SameResultOnOneAndTwoThreads) {
  const int saved = kernels::num_threads();
  for (int64_t N : {int64_t{1}, int64_t{8}, int64_t{200}}) {
    const int64_t C = 300, OC = 1000;
    const std::vector<float> x = testing::randn(N * C, 5), w0 = testing::randn(OC * C, 6);
    std::vector<uint16_t> wq(w0.size());
    convert_from_f32(wq.data(), w0.data(), DType::BF16, OC * C);
    std::vector<float> a(static_cast<size_t>(N * OC)), b(a.size());
    kernels::set_num_threads(1);
    nn::linear_fwd(a.data(), x.data(), TensorView{wq.data(), DType::BF16}, N, C, OC);
    kernels::set_num_threads(2);
    nn::linear_fwd(b.data(), x.data(), TensorView{wq.data(), DType::BF16}, N, C, OC);
    EXPECT_EQ(a, b) << "N=" << N;
  }
  kernels::set_num_threads(saved);
}

TEST(LinearLowp, F32IsTheFloatPathBitForBit) {
  for (int64_t N : {int64_t{1}, int64_t{9}, int64_t{64}}) {
    const int64_t C = 37, OC = 31, ldo = 40;
    const std::vector<float> x = testing::randn(N * C, 11), w = testing::randn(OC * C, 12);
    std::vector<float> a(static_cast<size_t>(N * ldo), 0.0f), b(a.size(), 0.0f);
    nn::linear_fwd(a.data(), x.data(), w.data(), N, C, OC, ldo);
    nn::linear_fwd(b.data(), x.data(), typed(w.data()), N, C, OC, ldo);
    ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "N=" << N;
  }
}

// A batched decode step's rows (2 to the few-row limit) come out the same whatever else is in
// the batch: each output's sum has one order, wherever its row falls in the register tiles. A
// served sequence's tokens then do not depend on which other sequences run beside it.
TEST(LinearLowp, FewRowsIndependentOfTheBatch) {
  for_each_target([] {
    for (DType t : {DType::F32, DType::BF16}) {
      const int64_t C = 256 + 5, OC = 4 * 7 + 3, N = 16;
      const std::vector<float> x = testing::randn(N * C, 31), w0 = testing::randn(OC * C, 32);
      std::vector<unsigned char> w(dtype_size(t) * OC * C);
      convert_from_f32(w.data(), w0.data(), t, OC * C);
      std::vector<float> all(static_cast<size_t>(N * OC));
      nn::linear_fwd(all.data(), x.data(), TensorView{w.data(), t}, N, C, OC);
      for (int64_t first : {int64_t{0}, int64_t{5}, int64_t{13}}) {
        for (int64_t n : {int64_t{2}, int64_t{3}, N - first}) {
          if (first + n > N) continue;
          std::vector<float> part(static_cast<size_t>(n * OC));
          nn::linear_fwd(part.data(), x.data() + first * C, TensorView{w.data(), t}, n, C, OC);
          ASSERT_EQ(std::memcmp(part.data(), all.data() + first * OC, part.size() * 4), 0)
              << dtype_name(t) << " rows " << first << ".." << first + n;
        }
      }
    }
  });
}

TEST(LinearLowp, RejectsBadStride) {
  const float x[4] = {};
  const uint16_t w[4] = {};
  float out[4];
  EXPECT_THROW(nn::linear_fwd(out, x, TensorView{w, DType::BF16}, 1, 2, 2, 1), InvalidArgument);
  EXPECT_THROW(nn::linear_fwd(out, x, TensorView{nullptr, DType::F16}, 1, 2, 2), InvalidArgument);
  EXPECT_THROW(nn::linear_fwd(out, x, TensorView{w, static_cast<DType>(7)}, 1, 2, 2), InvalidArgument);
}

TEST(EmbeddingLowp, GathersWidenedRows) {
  const int64_t V = 50, C = 37;
  for (DType t : {DType::BF16, DType::F16, DType::F32}) {
    const std::vector<float> table0 = testing::randn(V * C, 21);
    std::vector<unsigned char> table(dtype_size(t) * V * C);
    convert_from_f32(table.data(), table0.data(), t, V * C);
    std::vector<float> want(table0.size());
    convert_to_f32(want.data(), table.data(), t, V * C);
    const std::vector<int32_t> tokens = {3, 0, 49, 3};
    std::vector<float> out(tokens.size() * C);
    nn::embedding_fwd(out.data(), tokens.data(), TensorView{table.data(), t}, 4, C, V);
    for (size_t i = 0; i < tokens.size(); ++i) {
      for (int64_t c = 0; c < C; ++c) ASSERT_EQ(out[i * C + c], want[tokens[i] * C + c]);
    }
    const int32_t bad[2] = {1, 50};
    EXPECT_THROW(nn::embedding_fwd(out.data(), bad, TensorView{table.data(), t}, 2, C, V), InvalidArgument);
    const int32_t neg[1] = {-1};
    EXPECT_THROW(nn::embedding_fwd(out.data(), neg, TensorView{table.data(), t}, 1, C, V), InvalidArgument);
  }
}

}  // namespace
}  // namespace diffattn
