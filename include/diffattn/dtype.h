// Element types of stored tensors (safetensors files, weights kept as loaded, KV caches) and
// their conversions to and from float32. Compute is float32; BF16 and F16 are storage.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace diffattn {

enum class DType { F32, BF16, F16 };

size_t dtype_size(DType t);      // bytes per element: 4, 2, 2
const char* dtype_name(DType t);  // "F32", "BF16", "F16"
// "f32" | "bf16" | "f16" (any case; also "float32", "bfloat16", "float16"); anything else is an
// InvalidArgument naming `what` (a flag or a key) and the accepted names.
DType parse_dtype(const std::string& name, const std::string& what);

// bfloat16: the float's top 16 bits. From float: round to nearest even; NaN stays a (quiet) NaN.
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);
// IEEE 754 binary16. From float: round to nearest even, overflow to infinity, subnormals kept.
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// n elements of type t at src as float32 at dst, and back.
void convert_to_f32(float* dst, const void* src, DType t, int64_t n);
void convert_from_f32(void* dst, const float* src, DType t, int64_t n);

// A read-only tensor in its stored type: weights kept as loaded (BF16 stays BF16).
struct TypedPtr {
  const void* data = nullptr;
  DType dtype = DType::F32;
  // The data as float32; throws InvalidArgument when the tensor is stored in another type.
  const float* f32() const;
  // Element i as float32 (any type).
  float at(int64_t i) const;
};
inline TypedPtr typed(const float* p) { return TypedPtr{p, DType::F32}; }

}  // namespace diffattn
