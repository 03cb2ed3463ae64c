// `diffattn generate --bench` (generate_bench.h): the timing and the machine's limits.
#include "bench/runner/generate_bench.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/cases/bench_cases.h"
#include "diffattn/infer/generate.h"
#include "diffattn/infer/kv_store.h"
#include "diffattn/kernels/runtime.h"

namespace diffattn::bench {

namespace {

// Weight bytes a forward reads for each token: every matrix but the embedding table (one row
// a token), which is read whole when tied to the output layer.
double bytes_per_token(const model::Model& m) {
  double b = 0;
  for (const model::TensorInfo& t : m.tensors()) {
    if (t.name == "embed_tokens.weight" && !m.config().tie_embeddings) continue;
    b += static_cast<double>(t.numel) * static_cast<double>(dtype_size(m.weight(t.name).dtype));
  }
  return b;
}

// The layer index in a tensor name "layers.<l>. ...", or -1.
int64_t layer_of(const std::string& name) {
  if (name.rfind("layers.", 0) != 0) return -1;
  return std::stoll(name.substr(7, name.find('.', 7) - 7));
}

// A SambaY prefill (docs/models/phi4flash.md): every matrix of the self-decoder for every
// token, the cross-decoder's for the last only (it alone wants logits), the output layer for
// it; attention: the window layers' P x min(P, W) and the full-attention layer's P^2 / 2 scores
// and weighted values.
double prefill_flops_sambay(const model::Model& m, int64_t P) {
  const model::ModelConfig& c = m.config();
  double flops = 0;
  for (const model::TensorInfo& t : m.tensors()) {
    if (t.shape.size() != 2 || t.name == "embed_tokens.weight" || t.name.find("A_log") != std::string::npos) continue;
    const int64_t l = layer_of(t.name);
    flops += 2.0 * static_cast<double>(t.numel) * static_cast<double>(l > c.yoco_layer() ? 1 : P);
  }
  const nn::AttnLayerShape s = c.attn_shape(c.yoco_layer());
  const double Pd = static_cast<double>(P), per = static_cast<double>(s.q_heads() * s.D + s.q_heads() * s.Dv());
  int64_t windows = 0;
  for (int64_t l = 0; l < c.n_layers; ++l) windows += c.layer_kind(l) == model::LayerKind::SlidingAttention;
  const double W = static_cast<double>(std::min<int64_t>(P, c.sambay.window));
  flops += 2.0 * per * (static_cast<double>(windows) * Pd * W + Pd * Pd / 2.0);
  return flops + 2.0 * static_cast<double>(c.d_model * c.vocab_size);
}

// Multiply-adds x 2 of one prefill of P tokens: the projections and the MLP for every token,
// the output layer for the last, causal attention (about P^2/2 scores and P^2/2 weighted
// values per query head and map).
double prefill_flops(const model::Model& m, int64_t P) {
  const model::ModelConfig& c = m.config();
  if (c.recurrent()) return prefill_flops_sambay(m, P);
  double linear = 0;
  for (const model::TensorInfo& t : m.tensors()) {
    if (t.shape.size() == 2 && t.name != "embed_tokens.weight" && t.name != "lm_head.weight") {
      linear += static_cast<double>(t.numel);
    }
  }
  const nn::AttnLayerShape s = c.attn_shape(0);
  const double Pd = static_cast<double>(P);
  const double attn = static_cast<double>(c.n_layers) * Pd * Pd *
                      static_cast<double>(s.q_heads() * s.D + s.q_heads() * s.Dv());  // x 2 / 2
  return 2.0 * linear * Pd + 2.0 * static_cast<double>(c.d_model * c.vocab_size) + attn;
}

}  // namespace

int run_generate_bench(const model::Model& m, int64_t prompt_len, int64_t n, double load_s, DType kv_dtype) {
  const int64_t V = m.config().vocab_size;
  // n decode steps after the prompt: n + 1 new tokens, the last one sampled but not decoded.
  if (prompt_len + n + 1 > m.config().max_seq_len) {
    n = m.config().max_seq_len - prompt_len - 1;
  }
  std::vector<int32_t> prompt(static_cast<size_t>(prompt_len));
  for (int64_t i = 0; i < prompt_len; ++i) prompt[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919) % V);
  // The generation loop `generate` and Python run (one sequence in a contiguous store),
  // greedy; the first token marks the end of the prefill.
  infer::GenerateOptions o;
  o.max_new = n + 1;
  o.sampler = infer::SamplerOptions{0.0, 0, 1.0, 0};
  o.kv_dtype = kv_dtype;
  const auto t0 = std::chrono::steady_clock::now();
  auto t1 = t0;
  bool first = true;
  infer::generate_ids(m, prompt, o, [&](int32_t) {
    if (first) t1 = std::chrono::steady_clock::now();
    first = false;
    return true;
  });
  const auto t2 = std::chrono::steady_clock::now();
  const double pre = std::chrono::duration<double>(t1 - t0).count();
  const double dec = std::chrono::duration<double>(t2 - t1).count();
  struct rusage ru {};
  ::getrusage(RUSAGE_SELF, &ru);
  const double rss = static_cast<double>(ru.ru_maxrss) * 1024.0;
  // The machine's limits in the same run: sgemm rate and read bandwidth.
  const int threads = kernels::num_threads();
  const double sgemm = sgemm_gflops(1024, threads);
  ReadBandwidth bw_probe(int64_t{512} << 20);
  bw_probe.measure(threads);
  const double bw = bw_probe.measure(threads);
  const model::ModelConfig& c = m.config();
  const nn::AttnLayerShape s = c.attn_shape(c.recurrent() ? c.yoco_layer() : 0);
  // Decode's bytes a token: the weights plus the K/V cache read, at the mean length (a
  // recurrent model: its state, and the YOCO cache once more for each cross layer).
  const double mean_len = static_cast<double>(prompt_len) + static_cast<double>(n) / 2.0;
  const double es = static_cast<double>(dtype_size(kv_dtype));
  double kv = static_cast<double>(c.n_layers) * static_cast<double>(s.n_k() + s.n_v()) * es * mean_len;
  if (c.recurrent()) {
    int64_t cross = 0;
    for (int64_t l = 0; l < c.n_layers; ++l) cross += c.layer_kind(l) == model::LayerKind::CrossAttention;
    kv = infer::KvStore::sequence_bytes(c, static_cast<int64_t>(mean_len), kv_dtype) +
         static_cast<double>(cross) * static_cast<double>(s.n_k() + s.n_v()) * es * mean_len;
  }
  const double per_token = bytes_per_token(m) + kv;
  const double bound = bw * 1e9 / per_token;
  const double gflops = prefill_flops(m, prompt_len) / pre * 1e-9;
  std::printf("bench generate: %s, %lld params (%s), threads %d, backend %s, KV cache %s\n",
              c.recurrent() ? "sambay (phi4flash)" : nn::attn_kind_name(c.attention), static_cast<long long>(m.num_params()),
              m.storage().c_str(), threads, kernels::backend_name(kernels::resolve_backend(kernels::Backend::Auto)),
              dtype_name(kv_dtype));
  std::printf("  state a sequence holds after %lld positions: %.2f MiB (K/V%s)\n",
              static_cast<long long>(prompt_len + n),
              infer::KvStore::sequence_bytes(c, prompt_len + n, kv_dtype) / 1048576.0,
              c.recurrent() ? " of one layer, Mamba states, sliding windows" : " of every layer");
  std::printf("  load %.2f s; peak RSS %.2f GB = %.2f x the weights' %.2f GB\n", load_s, rss * 1e-9,
              rss / bytes_per_token(m), bytes_per_token(m) * 1e-9);
  std::printf("  prefill %lld tokens in %.3f s: %.1f tokens/s, %.1f GFLOP/s = %.2f x sgemm (%.1f GFLOP/s)\n",
              static_cast<long long>(prompt_len), pre, static_cast<double>(prompt_len) / pre, gflops,
              gflops / sgemm, sgemm);
  std::printf("  decode %lld tokens in %.3f s: %.2f tokens/s = %.2f x the bound %.2f tokens/s "
              "(read bandwidth %.1f GB/s / %.3f GB a token)\n",
              static_cast<long long>(n), dec, static_cast<double>(n) / dec,
              static_cast<double>(n) / dec / bound, bound, bw, per_token * 1e-9);
  return 0;
}

}  // namespace diffattn::bench
