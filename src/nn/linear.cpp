// Linear layers on BLAS (OpenBLAS cblas_sgemm): PyTorch's nn.Linear without bias, weight
// (OC, C). The forward and both backward products, gradients accumulated with beta = 1.
#include <cblas.h>

#include <algorithm>

#include "diffattn/kernels/runtime.h"
#include "diffattn/nn/layers.h"

extern "C" void openblas_set_num_threads(int);

namespace diffattn::nn {

void sync_blas_threads() {
  static thread_local int current = 0;
  const int n = kernels::num_threads();
  if (n != current) {
    openblas_set_num_threads(n);
    current = n;
  }
}

namespace {

// Fewer BLAS threads for one small product, then back to num_threads(). When idle OpenMP
// threads sleep (OMP_WAIT_POLICY=passive, which the tool sets on a busy machine), waking one
// costs more than a decode step's small matrix-vector product, so each thread must get at
// least kMinMacs multiply-adds: the small model's decoding ran 1.5x faster so (221 -> 335
// tokens/s on 2 threads, medians), where with spinning threads the same rule made it 1.4-1.8x
// slower; spinning keeps every thread. OpenBLAS's OpenMP build takes its thread count from
// OpenMP's (openblas_set_num_threads sets both), so the count is restored right after the call
// for the library's own parallel loops.
class SmallProductThreads {
 public:
  explicit SmallProductThreads(double macs) {
    sync_blas_threads();
    const bool passive = kernels::idle_threads_sleep();
    constexpr double kMinMacs = 1 << 20;
    all_ = kernels::num_threads();
    const int n = passive ? static_cast<int>(std::clamp(macs / kMinMacs, 1.0, static_cast<double>(all_))) : all_;
    if (n != all_) {
      openblas_set_num_threads(n);
      reduced_ = true;
    }
  }
  ~SmallProductThreads() {
    if (reduced_) openblas_set_num_threads(all_);
  }
  SmallProductThreads(const SmallProductThreads&) = delete;
  SmallProductThreads& operator=(const SmallProductThreads&) = delete;

 private:
  int all_ = 1;
  bool reduced_ = false;
};

}  // namespace

// out (N, OC) = inp (N, C) @ weight^T for a few rows by the multi-row matrix-vector kernel of
// linear_lowp.cpp (any weight dtype): each weight row read once for all N rows, no packing.
void linear_fwd_few_rows(float* out, const float* inp, TensorView weight, int64_t N, int64_t C,
                         int64_t OC, int64_t ldo);

void linear_fwd(float* out, const float* inp, const float* weight, int64_t N, int64_t C,
                int64_t OC, int64_t ldo) {
  if (N == 0) return;
  if (N >= 2 && N <= kGemvMaxN && C > 0 && OC > 0) {
    // A few rows (a batched decode step): sgemm would pack (copy) the whole weight per call,
    // which costs more than the product itself at these N.
    return linear_fwd_few_rows(out, inp, typed(weight), N, C, OC, ldo);
  }
  const SmallProductThreads threads(static_cast<double>(N) * static_cast<double>(C) * static_cast<double>(OC));
  if (N == 1) {
    // One row (a decode step): a matrix-vector product, which reads the weight once, as gemm
    // with M = 1 does not on every path.
    cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(OC), static_cast<int>(C), 1.0f,
                weight, static_cast<int>(C), inp, 1, 0.0f, out, 1);
    return;
  }
  // out (N, OC) = inp (N, C) @ weight^T (C, OC)
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(N), static_cast<int>(OC),
              static_cast<int>(C), 1.0f, inp, static_cast<int>(C), weight, static_cast<int>(C),
              0.0f, out, static_cast<int>(ldo ? ldo : OC));
}

void linear_bwd(float* dinp, float* dweight, const float* dout, const float* inp,
                const float* weight, int64_t N, int64_t C, int64_t OC, int64_t ldd,
                bool dinp_overwrite) {
  if (N == 0) return;
  sync_blas_threads();
  const int ld = static_cast<int>(ldd ? ldd : OC);
  if (dinp != nullptr) {
    // dinp (N, C) += dout (N, OC) @ weight (OC, C)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(N),
                static_cast<int>(C), static_cast<int>(OC), 1.0f, dout, ld, weight,
                static_cast<int>(C), dinp_overwrite ? 0.0f : 1.0f, dinp, static_cast<int>(C));
  }
  // dweight (OC, C) += dout^T (OC, N) @ inp (N, C)
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(OC), static_cast<int>(C),
              static_cast<int>(N), 1.0f, dout, ld, inp, static_cast<int>(C), 1.0f, dweight,
              static_cast<int>(C));
}

}  // namespace diffattn::nn
