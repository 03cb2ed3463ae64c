// `diffattn generate --model DIR --prompt TEXT`: sampled continuation, streamed to stdout.
// `--bench N` times N decode steps instead and prints tokens/s (bench/runner/generate_bench.h).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <string>

#include "bench/runner/generate_bench.h"
#include "cli/args.h"
#include "diffattn/base/text.h"
#include "diffattn/infer/session.h"
#include "diffattn/kernels/runtime.h"
#include "diffattn/model/checkpoint.h"
#include "diffattn/train/train.h"

namespace diffattn::cli {

namespace {

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
    return bench::run_generate_bench(
        m, std::max<int64_t>(1, std::min<int64_t>(bench_prompt, m.config().max_seq_len / 2)), bench_steps,
        load_s, kv_dtype);
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
