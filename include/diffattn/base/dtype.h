// Element types of stored tensors (safetensors F32, BF16, F16) and their conversions to and
// from float32. Low-precision weights stay in their stored type in memory; TensorView carries a
// pointer with its type to the kernels that read them (nn::linear_fwd, nn::embedding_fwd), which
// accumulate in float32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace diffattn {

enum class DType { F32, BF16, F16 };

// Bytes per element: 4, 2, 2.
size_t dtype_size(DType t);
// "F32", "BF16", "F16" (the safetensors names).
const char* dtype_name(DType t);
// "f32" | "bf16" | "f16" (any case; also "float32", "bfloat16", "float16"); anything else is an
// InvalidArgument naming `what` (a flag or a key) and the accepted names.
DType parse_dtype(const std::string& name, const std::string& what);

// bfloat16: the upper 16 bits of a float32. Widening is exact (a NaN keeps its bits).
float bf16_to_f32(uint16_t h);
// Round to nearest, ties to even; overflow rounds to +-inf; a NaN stays NaN with its sign and
// the top of its payload, quieted (so it can never round into an infinity).
uint16_t f32_to_bf16(float f);
// IEEE 754 binary16. Widening is exact for every finite value and infinity (subnormals too);
// a NaN keeps its sign and payload and comes back quiet (as F16C's vcvtph2ps does).
float f16_to_f32(uint16_t h);
// Round to nearest, ties to even, into subnormals; >= 65520 in magnitude rounds to +-inf; a
// NaN stays NaN (sign and top of the payload kept, quieted), as F16C's vcvtps2ph does.
uint16_t f32_to_f16(float f);

// dst (n) = src (n elements of type t, no alignment needed) widened to float32 (SIMD).
void convert_to_f32(float* dst, const void* src, DType t, int64_t n);
// dst (n elements of type t) = src (n) rounded as f32_to_bf16 / f32_to_f16 do.
void convert_from_f32(void* dst, const float* src, DType t, int64_t n);

}  // namespace diffattn
