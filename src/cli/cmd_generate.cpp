// `diffattn generate --model DIR --prompt TEXT`: sampled continuation, streamed to stdout.
// `--bench N` times N decode steps instead and prints tokens/s.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <string>

#include "bench/cases/bench_cases.h"
#include "cli/args.h"
#include "diffattn/base/text.h"
#include "diffattn/infer/session.h"
#include "diffattn/kernels/runtime.h"
#include "diffattn/model/checkpoint.h"
#include "diffattn/train/train.h"

namespace diffattn::cli {

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

int bench_decode(const model::Model& m, int64_t prompt_len, int64_t n, double load_s, DType kv_dtype) {
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
  const double sgemm = bench::sgemm_gflops(1024, threads);
  bench::ReadBandwidth bw_probe(int64_t{512} << 20);
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

int run_generate(const std::vector<std::string>& argv) {
  Args a("generate",
         "Continue a prompt with a model (diffattn's own directory, or a Hugging Face Llama,\n"
         "DiffLlama, Motif-2 or Phi-4-mini-flash directory with its tokenizer.json): the prompt is\n"
         "prefilled through the KV cache (and a hybrid's recurrent state), then one token at a\n"
         "time is decoded and printed as it comes (streamed, whole UTF-8 characters; bytes that\n"
         "form none as U+FFFD); it stops at the model's end-of-sequence id\n"
         "(generation_config.json or tokenizer_config.json).");
  a.option("--model", "DIR", "", "the model directory (required): diffattn's format or Hugging Face's")
      .option("--prompt", "TEXT", "",
              "the text to continue (empty: a newline); it must encode to at least one token and "
              "fewer than the model's max_seq_len")
      .option("--max-new", "N", "200",
              "new tokens to generate, at most; generation stops earlier when the prompt and the "
              "new tokens fill the model's max_seq_len (a note on stderr says so when --max-new "
              "was given)")
      .option("--temperature", "X", "0.8", "softmax temperature; 0 is greedy")
      .option("--top-k", "K", "0", "sample from the K most likely tokens (0: all)")
      .option("--top-p", "P", "1.0", "nucleus sampling: the smallest set with probability >= P")
      .option("--seed", "N", "0", "sampling seed")
      .option("--kv-dtype", "T", "f32",
              "the KV cache's storage: f32, bf16 or f16 (half the bytes, rounded once when "
              "written; attention still computes in float32)")
      .option("--bench", "N", "0",
              "time a prefill of --bench-prompt tokens and N decode steps instead: load time, peak "
              "RSS against the weights, prefill GFLOP/s against the same-run sgemm rate, decode "
              "tokens/s against read bandwidth / bytes read a token")
      .option("--bench-prompt", "P", "64", "prompt tokens of --bench")
      .option("--tokenizer", "WHICH", "model",
              "model: the directory's tokenizer (a Hugging Face directory must have one); bytes: raw "
              "bytes as token ids");
  if (!a.parse(argv)) return 0;
  if (!a.given("--model")) throw UsageError("--model DIR is required");
  const std::string dir = a.str("--model");
  // Every flag is checked before the model is read: a bad flag is a usage error (status 2)
  // whatever the directory holds.
  const DType kv_dtype = from_flags([&] { return parse_dtype(a.str("--kv-dtype"), "--kv-dtype"); });
  const data::TokenizerChoice tok_choice =
      from_flags([&] { return data::parse_tokenizer_choice(a.str("--tokenizer"), "--tokenizer"); });
  const int64_t bench_steps = a.integer("--bench", 0, int64_t{1} << 40);
  const int64_t bench_prompt = a.integer("--bench-prompt", 1, int64_t{1} << 24);
  infer::GenerateOptions o;
  o.max_new = a.integer("--max-new", 0, int64_t{1} << 40);
  o.sampler.temperature = a.number("--temperature", 0, 1e30);
  o.sampler.top_k = a.integer("--top-k", 0, int64_t{1} << 40);
  o.sampler.top_p = a.number("--top-p");
  if (!(o.sampler.top_p > 0 && o.sampler.top_p <= 1)) {
    throw UsageError("--top-p must be in (0, 1], got " + a.str("--top-p"));
  }
  o.sampler.seed = static_cast<uint64_t>(a.integer("--seed", 0, INT64_MAX));
  const auto t_load = std::chrono::steady_clock::now();
  const model::ModelDir md = model::open_model_dir(dir);
  model::Model m = model::load_model(md);
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
  if (bench_steps > 0) {
    return bench_decode(m, std::max<int64_t>(1, std::min<int64_t>(bench_prompt, m.config().max_seq_len / 2)),
                        bench_steps, load_s, kv_dtype);
  }
  const auto tok = data::tokenizer_for(md, tok_choice);
  o.stop_ids = train::stop_ids_for(md, *tok, m.config().vocab_size);
  o.kv_dtype = kv_dtype;
  const std::string prompt = a.str("--prompt");
  {
    const size_t n = tok->encode(prompt.empty() ? std::string("\n") : prompt).size();
    const int64_t cap = m.config().max_seq_len;
    if (n == 0) {
      throw UsageError("--prompt encodes to no tokens with the model's " + tok->name() +
                       " tokenizer (it is empty or only whitespace); give some text to continue");
    }
    if (static_cast<int64_t>(n) >= cap) {
      throw UsageError("--prompt is " + plural(static_cast<long long>(n), "token") + "; the model's max_seq_len is " +
                       std::to_string(cap) + ", so a prompt may have at most " +
                       plural(cap - 1, "token"));
    }
    // The default --max-new only says "until max_seq_len" on a short model: a note only when
    // the user asked for more than fits.
    if (a.given("--max-new") && static_cast<int64_t>(n) + o.max_new > cap) {
      std::cerr << "diffattn generate: note: the prompt (" << plural(static_cast<long long>(n), "token")
                << ") and --max-new " << o.max_new << " exceed max_seq_len " << cap << "; generating "
                << plural(cap - static_cast<int64_t>(n), "new token") << "\n";
    }
  }
  std::cout << prompt << std::flush;
  train::generate(m, *tok, prompt, o, [](const std::string& piece) { std::cout << piece << std::flush; });
  std::cout << "\n";
  return 0;
}

const CommandRegistration reg({"generate", "continue a prompt with a trained model (KV cache, sampling)", 13,
                               run_generate});

}  // namespace

}  // namespace diffattn::cli
