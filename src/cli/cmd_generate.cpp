// `diffattn generate --model DIR --prompt TEXT`: sampled continuation, streamed to stdout.
// `--bench N` times N decode steps instead and prints tokens/s.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iostream>

#include "cli/args.h"
#include "diffattn/train.h"
#include "diffattn/runtime.h"

namespace diffattn::cli {

namespace {

// --kv-dtype: f32, bf16 or f16.
DType parse_kv_dtype(const std::string& name) {
  if (name == "f32") return DType::F32;
  if (name == "bf16") return DType::BF16;
  if (name == "f16") return DType::F16;
  throw UsageError("--kv-dtype is \"" + name + "\", expected f32, bf16 or f16");
}

int bench_decode(Model& m, int64_t prompt_len, int64_t n, DType kv_dtype) {
  const int64_t V = m.config().vocab_size;
  if (prompt_len + n > m.config().max_seq_len) {
    n = m.config().max_seq_len - prompt_len;
  }
  std::vector<int32_t> prompt(static_cast<size_t>(prompt_len));
  for (int64_t i = 0; i < prompt_len; ++i) prompt[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919) % V);
  std::vector<float> logits(static_cast<size_t>(V));
  m.cache_reset(1, prompt_len + n, kv_dtype);
  const auto t0 = std::chrono::steady_clock::now();
  m.infer(prompt.data(), 1, prompt_len, logits.data());
  const auto t1 = std::chrono::steady_clock::now();
  Sampler greedy({0.0, 0, 1.0, 0});
  for (int64_t i = 0; i < n; ++i) {
    const int32_t next = greedy.sample(logits.data(), V);
    m.infer(&next, 1, 1, logits.data());
  }
  const auto t2 = std::chrono::steady_clock::now();
  const double pre = std::chrono::duration<double>(t1 - t0).count();
  const double dec = std::chrono::duration<double>(t2 - t1).count();
  std::printf("bench generate: %s params %lld threads %d backend %s kv %s: prefill %lld tokens in %.4f s "
              "(%.0f tokens/s), decode %lld tokens in %.4f s, %.1f tokens/s\n",
              nn::attn_kind_name(m.config().attention), static_cast<long long>(m.num_params()),
              num_threads(), backend_name(resolve_backend(Backend::Auto)), dtype_name(kv_dtype),
              static_cast<long long>(prompt_len), pre, static_cast<double>(prompt_len) / pre,
              static_cast<long long>(n), dec, static_cast<double>(n) / dec);
  return 0;
}

int run_generate(const std::vector<std::string>& argv) {
  Args a("generate",
         "Continue a prompt with a trained model: the prompt is prefilled through the KV cache,\n"
         "then one token at a time is decoded and printed as it comes (streamed).");
  a.option("--model", "DIR", "", "the model directory (required)")
      .option("--prompt", "TEXT", "",
              "the text to continue (empty: a newline); it must encode to at least one token and "
              "fewer than the model's max_seq_len")
      .option("--max-new", "N", "200",
              "new tokens to generate, at most; generation stops earlier when the prompt and the "
              "new tokens fill the model's max_seq_len (a note on stderr says so)")
      .option("--temperature", "X", "0.8", "softmax temperature; 0 is greedy")
      .option("--top-k", "K", "0", "sample from the K most likely tokens (0: all)")
      .option("--top-p", "P", "1.0", "nucleus sampling: the smallest set with probability >= P")
      .option("--seed", "N", "0", "sampling seed")
      .option("--kv-dtype", "T", "f32",
              "the KV cache's storage: f32, bf16 or f16 (half the bytes, rounded once when "
              "written; attention still computes in float32)")
      .option("--bench", "N", "0", "time N decode steps after a 64-token prompt instead");
  if (!a.parse(argv)) return 0;
  if (!a.given("--model")) throw UsageError("--model DIR is required");
  const std::string dir = a.str("--model");
  const DType kv_dtype = parse_kv_dtype(a.str("--kv-dtype"));
  Model m = load_model(dir);
  const int64_t bench_steps = a.integer("--bench", 0, int64_t{1} << 40);
  if (bench_steps > 0) {
    return bench_decode(m, std::max<int64_t>(1, std::min<int64_t>(64, m.config().max_seq_len / 2)),
                        bench_steps, kv_dtype);
  }
  const auto tok = data::tokenizer_for(dir);
  data::GenerateOptions o;
  o.max_new = a.integer("--max-new", 0, int64_t{1} << 40);
  o.sampler.temperature = a.number("--temperature", 0, 1e30);
  o.sampler.top_k = a.integer("--top-k", 0, int64_t{1} << 40);
  o.sampler.top_p = a.number("--top-p");
  if (!(o.sampler.top_p > 0 && o.sampler.top_p <= 1)) {
    throw UsageError("--top-p must be in (0, 1], got " + a.str("--top-p"));
  }
  o.sampler.seed = static_cast<uint64_t>(a.integer("--seed", 0, INT64_MAX));
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
      throw UsageError("--prompt is " + std::to_string(n) + " tokens; the model's max_seq_len is " +
                       std::to_string(cap) + ", so a prompt may have at most " +
                       std::to_string(cap - 1) + " tokens");
    }
    if (static_cast<int64_t>(n) + o.max_new > cap) {
      std::cerr << "diffattn generate: note: the prompt (" << n << " tokens) and --max-new "
                << o.max_new << " exceed max_seq_len " << cap << "; generating "
                << cap - static_cast<int64_t>(n) << " new tokens\n";
    }
  }
  std::cout << prompt << std::flush;
  data::generate(m, *tok, prompt, o, [](const std::string& piece) { std::cout << piece << std::flush; });
  std::cout << "\n";
  return 0;
}

const CommandRegistration reg({"generate", "continue a prompt with a trained model (KV cache, sampling)", 13,
                               run_generate});

}  // namespace

}  // namespace diffattn::cli
