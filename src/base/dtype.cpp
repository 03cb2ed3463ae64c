// Scalar conversions between float32 and the 16-bit storage types (include/diffattn/dtype.h).
#include "diffattn/dtype.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "diffattn/error.h"

namespace diffattn {

size_t dtype_size(DType t) { return t == DType::F32 ? 4 : 2; }

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
  }
  return "?";
}

DType parse_dtype(const std::string& name, const std::string& what) {
  std::string s;
  for (char c : name) s.push_back(static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c));
  if (s == "f32" || s == "float32") return DType::F32;
  if (s == "bf16" || s == "bfloat16") return DType::BF16;
  if (s == "f16" || s == "float16") return DType::F16;
  throw InvalidArgument(what + " is \"" + name + "\", expected f32, bf16 or f16");
}

namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

float bf16_to_f32(uint16_t h) { return float_of(static_cast<uint32_t>(h) << 16); }

uint16_t f32_to_bf16(float f) {
  const uint32_t u = bits_of(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  // Round to nearest even: add 0x7fff plus the lowest kept bit, then truncate.
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  float f;
  if (exp == 0) {
    f = std::ldexp(static_cast<float>(man), -24);  // zero or subnormal
  } else if (exp == 31) {
    f = man ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  } else {
    f = std::ldexp(static_cast<float>(man | 0x400), static_cast<int>(exp) - 25);
  }
  return float_of(bits_of(f) | sign);
}

uint16_t f32_to_f16(float f) {
  const uint32_t u = bits_of(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00);  // NaN
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00);  // rounds to >= 65520: inf
  if (a < 0x38800000u) {
    // Below the smallest normal half (2^-14): a multiple of 2^-24, rounded to nearest even by
    // the float addition (exact for these magnitudes).
    const float r = float_of(a) + 0.5f;  // 0.5 = 2^-1: the sum's ulp is 2^-24
    return static_cast<uint16_t>(sign | (bits_of(r) - bits_of(0.5f)));
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits to even.
  const uint32_t m = a + ((15u - 127u) << 23) + 0xfffu + ((a >> 13) & 1u);
  return static_cast<uint16_t>(sign | (m >> 13));
}

void convert_to_f32(float* dst, const void* src, DType t, int64_t n) {
  if (t == DType::F32) {
    std::memcpy(dst, src, sizeof(float) * static_cast<size_t>(n));
    return;
  }
  const auto* s = static_cast<const uint16_t*>(src);
  if (t == DType::BF16) {
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
  }
}

void convert_from_f32(void* dst, const float* src, DType t, int64_t n) {
  if (t == DType::F32) {
    std::memcpy(dst, src, sizeof(float) * static_cast<size_t>(n));
    return;
  }
  auto* d = static_cast<uint16_t*>(dst);
  if (t == DType::BF16) {
    for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
  }
}

const float* TypedPtr::f32() const {
  if (dtype != DType::F32) {
    throw InvalidArgument(std::string("a tensor stored as ") + dtype_name(dtype) +
                          " was used where float32 is needed");
  }
  return static_cast<const float*>(data);
}

float TypedPtr::at(int64_t i) const {
  switch (dtype) {
    case DType::F32: return static_cast<const float*>(data)[i];
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(data)[i]);
  }
  return 0.0f;
}

}  // namespace diffattn
