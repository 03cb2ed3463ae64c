// Element types and their conversions (include/diffattn/base/dtype.h): the scalar definitions that
// every other path is tested against, and convert_to_f32 compiled by Highway for AVX-512, AVX2
// (F16C) and a portable fallback, chosen at run time. Only widening is on a hot path (a
// checkpoint's BF16/F16 tensors read as float32, embedding rows); narrowing is scalar.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "base/dtype.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

#include <cstring>
#include <string>

#include "diffattn/base/dtype.h"
#include "diffattn/base/error.h"

HWY_BEFORE_NAMESPACE();
namespace diffattn::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// src may be only byte-aligned (a safetensors tensor at an odd offset): read through memcpy.
HWY_INLINE uint16_t load_u16(const uint16_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}

// dst (n) = bf16 src (n): zero-extend each 16-bit pattern and shift it into the top half.
void Bf16ToF32(float* HWY_RESTRICT dst, const uint16_t* HWY_RESTRICT src, int64_t n) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du32;
  const hn::Rebind<uint16_t, decltype(df)> du16;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + L <= n; i += L) {
    const auto w = hn::PromoteTo(du32, hn::LoadU(du16, src + i));
    hn::StoreU(hn::BitCast(df, hn::ShiftLeft<16>(w)), df, dst + i);
  }
  for (; i < n; ++i) dst[i] = bf16_to_f32(load_u16(src + i));
}

// dst (n) = f16 src (n). Highway's x86 targets widen with F16C (exact, NaNs quieted, as
// f16_to_f32); the portable fallback's emulation is not relied on for NaN payloads, so it
// takes the scalar loop.
void F16ToF32(float* HWY_RESTRICT dst, const uint16_t* HWY_RESTRICT src, int64_t n) {
  int64_t i = 0;
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  const hn::ScalableTag<float> df;
  const hn::Rebind<hwy::float16_t, decltype(df)> dh;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  const auto* h = reinterpret_cast<const hwy::float16_t*>(src);
  for (; i + L <= n; i += L) hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, h + i)), df, dst + i);
#endif
  for (; i < n; ++i) dst[i] = f16_to_f32(load_u16(src + i));
}

}  // namespace diffattn::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace diffattn {

HWY_EXPORT(Bf16ToF32);
HWY_EXPORT(F16ToF32);

size_t dtype_size(DType t) { return t == DType::F32 ? 4 : 2; }

DType parse_dtype(const std::string& name, const std::string& what) {
  std::string s;
  for (char c : name) s.push_back(static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c));
  if (s == "f32" || s == "float32") return DType::F32;
  if (s == "bf16" || s == "bfloat16") return DType::BF16;
  if (s == "f16" || s == "float16") return DType::F16;
  throw InvalidArgument(what + " is \"" + name + "\", expected f32, bf16 or f16");
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
  }
  return "?";
}

namespace {
uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
float float_of(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
}  // namespace

float bf16_to_f32(uint16_t h) { return float_of(static_cast<uint32_t>(h) << 16); }

uint16_t f32_to_bf16(float f) {
  const uint32_t b = bits_of(f);
  if ((b & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((b >> 16) | 0x0040u);  // NaN
  // Adding 0x7fff plus the lowest kept bit carries into the kept half exactly when the dropped
  // half is above one half ulp, or equal to it with an odd kept half (ties to even); a carry
  // out of the mantissa steps the exponent, and out of the largest finite value gives inf.
  const uint32_t rounding = 0x7fffu + ((b >> 16) & 1u);
  return static_cast<uint16_t>((b + rounding) >> 16);
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 31) return float_of(sign | 0x7f800000u | (man << 13) | (man ? 0x400000u : 0u));
  if (exp == 0) {
    // zero or subnormal: man * 2^-24, exact in float32
    const float v = static_cast<float>(man) * 0x1p-24f;
    return float_of(sign | bits_of(v));
  }
  // rebias the exponent (15 -> 127) and widen the mantissa (10 -> 23 bits)
  return float_of(sign | ((exp + 112u) << 23) | (man << 13));
}

uint16_t f32_to_f16(float f) {
  const uint32_t b = bits_of(f);
  const uint16_t sign = static_cast<uint16_t>((b >> 16) & 0x8000u);
  const uint32_t x = b & 0x7fffffffu;
  if (x > 0x7f800000u) return sign | 0x7e00u | static_cast<uint16_t>((x >> 13) & 0x3ffu);  // NaN
  // 65520 = 0x477ff000 is halfway between 65504 (odd mantissa) and 2^16: ties go to inf.
  if (x >= 0x477ff000u) return sign | 0x7c00u;
  uint32_t kept, rest, half;
  if (x >= 0x38800000u) {  // normal in half: >= 2^-14
    kept = ((x >> 23) - 112u) << 10 | ((x >> 13) & 0x3ffu);
    rest = x & 0x1fffu;
    half = 0x1000u;
  } else {
    // Subnormal or zero in half, in units of 2^-24: (1.m * 2^(e-127)) / 2^-24 = mant >> (126 - e).
    // At or below 2^-25 (half a unit, a tie with even 0) everything rounds to zero.
    if (x <= 0x33000000u) return sign;
    const uint32_t e = x >> 23, mant = (x & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - e;  // 14..24 here
    kept = mant >> shift;
    rest = mant & ((1u << shift) - 1u);
    half = 1u << (shift - 1u);
  }
  // Round to nearest even; a carry out of the mantissa steps the exponent (the largest
  // subnormal rounds up to the smallest normal, 0x3ff + 1 = 0x400), which is the right encoding.
  if (rest > half || (rest == half && (kept & 1u))) ++kept;
  return static_cast<uint16_t>(sign | kept);
}

void convert_to_f32(float* dst, const void* src, DType t, int64_t n) {
  if (n <= 0) return;
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case DType::BF16:
      HWY_DYNAMIC_DISPATCH(Bf16ToF32)(dst, static_cast<const uint16_t*>(src), n);
      return;
    case DType::F16:
      HWY_DYNAMIC_DISPATCH(F16ToF32)(dst, static_cast<const uint16_t*>(src), n);
      return;
  }
  throw InvalidArgument("convert_to_f32: unknown dtype " + std::to_string(static_cast<int>(t)));
}

void convert_from_f32(void* dst, const float* src, DType t, int64_t n) {
  if (n <= 0) return;
  if (t == DType::F32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * 4);
    return;
  }
  if (t != DType::BF16 && t != DType::F16) {
    throw InvalidArgument("convert_from_f32: unknown dtype " + std::to_string(static_cast<int>(t)));
  }
  auto* out = static_cast<unsigned char*>(dst);  // no alignment assumed
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = t == DType::BF16 ? f32_to_bf16(src[i]) : f32_to_f16(src[i]);
    std::memcpy(out + 2 * i, &h, 2);
  }
}

}  // namespace diffattn
#endif  // HWY_ONCE
