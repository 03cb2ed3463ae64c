// Times nn::linear_fwd with BF16/F16 weights (src/nn/linear_lowp.cpp) against this machine's
// limits measured in the same run: the matrix-vector rows (N = 1, 8) as GB/s of weight read and
// their ratio to the memory read bandwidth; the prefill rows (N = 512) as GFLOP/s and their ratio
// to sgemm on the same shape with float32 weights. Rounds are interleaved (bandwidth, sgemm, each
// row once per round) and ratios taken per round, then their median, so a drift of the shared
// machine's speed cancels. Matrix-vector calls cycle through copies of the weight totalling
// >= --rotate-mb, so each call reads its weight from memory as decode does (a model's weights
// are far larger than the caches).
#include <cblas.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench/cases/bench_cases.h"
#include "diffattn/base/dtype.h"
#include "diffattn/kernels/runtime.h"
#include "diffattn/nn/layers.h"

namespace {

using namespace diffattn;

// Uniform in [-scale, scale) from a 64-bit LCG: fast enough for a 262M-element weight.
std::vector<float> uniform(int64_t n, uint64_t seed, float scale) {
  std::vector<float> v(static_cast<size_t>(n));
  uint64_t st = seed * 0x9E3779B97F4A7C15ull + 1;
  for (float& x : v) {
    st = st * 6364136223846793005ull + 1442695040888963407ull;
    x = scale * (static_cast<float>(st >> 40) * 0x1p-23f - 1.0f);
  }
  return v;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

struct WShape {
  int64_t OC, C;
};

struct Row {
  std::string what;  // "gemv N=1 BF16 8192x2048"
  bool gemm;         // ratio to sgemm (else to bandwidth)
  double units;      // FLOPs (gemm) or weight bytes (gemv) per timed call
  std::function<void()> run;
  std::function<void()> run_ref;  // gemm: float32 sgemm of the same shape (ratio's denominator)
  std::vector<double> rate, ratio;
};

void usage() {
  std::printf(
      "usage: bench_linear_lowp [--threads 1,2] [--rounds 5] [--rotate-mb 512]\n"
      "                         [--shapes 2048x2048,8192x2048,2048x8192,128256x2048]\n"
      "                         [--few 16,32]\n"
      "Shapes are OC x C (weight rows x columns). Prints, per thread count, typed matrix-vector\n"
      "GB/s of weight read (N = 1, 8) over the same run's read bandwidth, and typed GFLOP/s of\n"
      "the --few row counts (a batched decode step's N sequences; the weight read from memory)\n"
      "and of N = 512 over float32 sgemm of the same shape.\n");
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t a = 0;
  while (a <= s.size()) {
    const size_t b = std::min(s.find(sep, a), s.size());
    if (b > a) out.push_back(s.substr(a, b - a));
    a = b + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> thread_counts{1, 2};
  int rounds = 5;
  int64_t rotate_mb = 512;
  std::vector<WShape> shapes{{2048, 2048}, {8192, 2048}, {2048, 8192}, {128256, 2048}};
  std::vector<int64_t> few{16, 32};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") return usage(), 0;
    if (i + 1 >= argc) return usage(), 2;
    const std::string v = argv[++i];
    if (a == "--threads") {
      thread_counts.clear();
      for (const auto& t : split(v, ',')) thread_counts.push_back(std::atoi(t.c_str()));
    } else if (a == "--few") {
      few.clear();
      for (const auto& t : split(v, ',')) few.push_back(std::atoll(t.c_str()));
    } else if (a == "--rounds") {
      rounds = std::atoi(v.c_str());
    } else if (a == "--rotate-mb") {
      rotate_mb = std::atoll(v.c_str());
    } else if (a == "--shapes") {
      shapes.clear();
      for (const auto& s : split(v, ',')) {
        const auto p = split(s, 'x');
        if (p.size() != 2) return usage(), 2;
        shapes.push_back({std::atoll(p[0].c_str()), std::atoll(p[1].c_str())});
      }
    } else {
      return usage(), 2;
    }
  }
  if (rounds < 1 || rotate_mb < 1 || thread_counts.empty() || shapes.empty()) return usage(), 2;
  for (int t : thread_counts)
    if (t < 1) return usage(), 2;
  for (const WShape& s : shapes)
    if (s.OC < 1 || s.C < 1) return usage(), 2;
  for (int64_t n : few)
    if (n < 1 || n > 512) return usage(), 2;

  constexpr int64_t kPrefillN = 512;
  int64_t maxC = 0, maxOC = 0;
  for (const WShape& s : shapes) maxC = std::max(maxC, s.C), maxOC = std::max(maxOC, s.OC);
  const std::vector<float> x = uniform(kPrefillN * maxC, 1, 1.0f);
  std::vector<float> out(static_cast<size_t>(kPrefillN * maxOC));

  // Per shape: float32 weights (sgemm's reference), and rotating copies of the BF16 and F16 weights.
  struct Weights {
    std::vector<float> f32;
    std::vector<std::vector<uint16_t>> lowp[2];
  };
  std::vector<Weights> weights(shapes.size());
  const DType types[2] = {DType::BF16, DType::F16};
  for (size_t s = 0; s < shapes.size(); ++s) {
    const int64_t n = shapes[s].OC * shapes[s].C;
    weights[s].f32 = uniform(n, 2 + s, 0.02f);
    const int64_t copies = std::max<int64_t>(1, ((rotate_mb << 20) + 2 * n - 1) / (2 * n));
    for (int k = 0; k < 2; ++k) {
      weights[s].lowp[k].resize(static_cast<size_t>(copies));
      for (auto& c : weights[s].lowp[k]) {
        c.resize(static_cast<size_t>(n));
        convert_from_f32(c.data(), weights[s].f32.data(), types[k], n);
      }
    }
  }

  std::vector<Row> rows;
  for (size_t s = 0; s < shapes.size(); ++s) {
    const WShape sh = shapes[s];
    const std::string dims = std::to_string(sh.OC) + "x" + std::to_string(sh.C);
    Weights& w = weights[s];
    for (int64_t N : {int64_t{1}, int64_t{8}}) {
      for (int k = 0; k < 2; ++k) {
        auto& copies = w.lowp[k];
        const DType t = types[k];
        rows.push_back({"gemv N=" + std::to_string(N) + " " + dtype_name(t) + " " + dims, false,
                        2.0 * sh.OC * sh.C * static_cast<double>(copies.size()),
                        [&, sh, N, t] {
                          for (auto& c : copies)
                            nn::linear_fwd(out.data(), x.data(), TensorView{c.data(), t}, N, sh.C, sh.OC);
                        },
                        nullptr, {}, {}});
      }
    }
    // A batched decode step: N rows against a weight read from memory (rotating copies), over
    // sgemm with the float32 weight (one copy) at the same N.
    for (int64_t N : few) {
      for (int k = 0; k < 2; ++k) {
        auto& copies = w.lowp[k];
        const DType t = types[k];
        const size_t n_copies = copies.size();
        rows.push_back({"gemm N=" + std::to_string(N) + " " + dtype_name(t) + " " + dims, true,
                        2.0 * N * sh.OC * sh.C * static_cast<double>(n_copies),
                        [&, sh, N, t] {
                          for (auto& c : copies)
                            nn::linear_fwd(out.data(), x.data(), TensorView{c.data(), t}, N, sh.C, sh.OC);
                        },
                        [&, sh, N, n_copies] {  // OpenBLAS itself (linear_fwd would take the
                          // few-rows kernel at this N)
                          const int n = static_cast<int>(N), oc = static_cast<int>(sh.OC),
                                    cc = static_cast<int>(sh.C);
                          for (size_t i = 0; i < n_copies; ++i) {
                            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, oc, cc, 1.0f,
                                        x.data(), cc, w.f32.data(), cc, 0.0f, out.data(), oc);
                          }
                        },
                        {}, {}});
      }
    }
    // The same rows with the float32 weight (a trained model's): linear_fwd takes the few-rows
    // kernel for N <= kGemvMaxN, over OpenBLAS itself.
    for (int64_t N : few) {
      rows.push_back({"gemm N=" + std::to_string(N) + " F32 " + dims, true, 2.0 * N * sh.OC * sh.C,
                      [&, sh, N] { nn::linear_fwd(out.data(), x.data(), w.f32.data(), N, sh.C, sh.OC); },
                      [&, sh, N] {
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(N),
                                    static_cast<int>(sh.OC), static_cast<int>(sh.C), 1.0f, x.data(),
                                    static_cast<int>(sh.C), w.f32.data(), static_cast<int>(sh.C), 0.0f,
                                    out.data(), static_cast<int>(sh.OC));
                      },
                      {}, {}});
    }
    for (int k = 0; k < 2; ++k) {
      const DType t = types[k];
      auto& c = w.lowp[k][0];
      rows.push_back({"gemm N=512 " + std::string(dtype_name(t)) + " " + dims, true,
                      2.0 * kPrefillN * sh.OC * sh.C,
                      [&, sh, t] {
                        nn::linear_fwd(out.data(), x.data(), TensorView{c.data(), t}, kPrefillN, sh.C, sh.OC);
                      },
                      [&, sh] {
                        nn::linear_fwd(out.data(), x.data(), w.f32.data(), kPrefillN, sh.C, sh.OC);
                      },
                      {}, {}});
    }
  }

  bench::ReadBandwidth bw(int64_t{1} << 30);
  for (int threads : thread_counts) {
    kernels::set_num_threads(threads);
    std::vector<double> bands;
    for (Row& r : rows) r.rate.clear(), r.ratio.clear();
    for (int round = 0; round <= rounds; ++round) {  // round 0 warms up
      const double band = bw.measure(threads);
      if (round > 0) bands.push_back(band);
      for (Row& r : rows) {
        const double t = bench::seconds_of(r.run);
        const double rate = r.units / t * 1e-9;
        if (r.gemm) {
          const double ref = r.units / bench::seconds_of(r.run_ref) * 1e-9;
          if (round > 0) r.rate.push_back(rate), r.ratio.push_back(rate / ref);
        } else if (round > 0) {
          r.rate.push_back(rate), r.ratio.push_back(rate / band);
        }
      }
    }
    std::printf("threads %d, %d rounds (medians; ratios per round, then median)\n", threads, rounds);
    std::printf("memory read bandwidth: %.1f GB/s\n", median(bands));
    for (const Row& r : rows) {
      std::printf("  %-28s %8.1f %s   x %.2f %s\n", r.what.c_str(), median(r.rate),
                  r.gemm ? "GFLOP/s" : "GB/s   ", median(r.ratio),
                  r.gemm ? "sgemm (float32 weights, same shape)" : "read bandwidth");
    }
    std::fflush(stdout);
  }
  return 0;
}
