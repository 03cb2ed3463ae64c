// Matrix-vector products of few input rows against a weight in its stored type (F32, BF16,
// F16): the decode step's and a small batch's linear layers (nn::linear_fwd_few_rows splits the
// weight rows across threads and calls this per block). Memory-bound: each weight vector is
// read once per call and widened to float32 in registers for all the input rows (a 16-bit
// weight moves 2 bytes per element instead of 4). Accumulation is float32. Compiled by Highway
// for AVX-512, AVX2 (F16C) and a portable fallback, chosen at run time (src/kernels/gemv.cpp).
#pragma once

#include <cstdint>

#include "diffattn/base/dtype.h"

namespace diffattn::kernels {

// out[m * ldo + r] = sum_c w[r, c] x[m, c] for the N input rows m (x (N, C), rows at stride C)
// and the weight rows r in [r0, r1) (w (rows, C) of type t, rows at stride C). One thread; no
// checks (the caller's layer checked the sizes and the type).
void gemv_rows(float* out, int64_t ldo, const float* x, const void* w, DType t, int64_t N, int64_t C,
               int64_t r0, int64_t r1);

}  // namespace diffattn::kernels
