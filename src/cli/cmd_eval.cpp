// `diffattn eval --model DIR`: validation loss and perplexity on the corpus's held-out lines.
#include <cmath>
#include <cstdio>

#include "cli/args.h"
#include "diffattn/model/checkpoint.h"
#include "diffattn/model/train_context.h"
#include "diffattn/train/train.h"

namespace diffattn::cli {

namespace {

int run_eval(const std::vector<std::string>& argv) {
  Args a("eval", "Validation loss and perplexity of a model on its corpus's validation split\n"
                 "(every 20th line of the text).");
  a.option("--model", "DIR", "", "the model directory (required)")
      .option("--corpus", "SPEC", "kjv", "kjv or the path of a text file")
      .option("--batch", "B", "8", "sequences per batch")
      .option("--seq-len", "T", "128", "tokens per sequence (at most the model's max_seq_len)")
      .option("--batches", "N", "0", "at most N batches (0: the whole validation split)")
      .option("--tokenizer", "WHICH", "model",
              "model: the directory's tokenizer (a Hugging Face directory must have one); bytes: raw "
              "bytes as token ids");
  if (!a.parse(argv)) return 0;
  if (!a.given("--model")) throw UsageError("--model DIR is required");
  const std::string dir = a.str("--model");
  // The flags first: a bad one is a usage error (status 2) whatever the directory holds.
  const data::TokenizerChoice choice =
      from_flags([&] { return data::parse_tokenizer_choice(a.str("--tokenizer"), "--tokenizer"); });
  const int64_t batch = a.integer("--batch", 1, int64_t{1} << 40);
  const int64_t seq_len = a.integer("--seq-len", 1, int64_t{1} << 40);
  const int64_t batches = a.integer("--batches", 0, int64_t{1} << 40);
  const model::ModelDir md = model::open_model_dir(dir);
  const model::Model m = model::load_model(md);
  const auto tok = data::tokenizer_for(md, choice);
  const data::Corpus c = data::load_corpus(a.str("--corpus"), data::default_cache_dir());
  const std::vector<int32_t> valid = tok->encode(c.valid);
  const int64_t T = std::min(seq_len, m.config().max_seq_len);
  model::TrainContext run(m);
  const double loss = data::eval_loss(run, valid, batch, T, batches);
  std::printf("%s on %s validation (%zu tokens, T %lld): loss %.4f  perplexity %.3f  (%.4f bits per token)\n",
              dir.c_str(), c.name.c_str(), valid.size(), static_cast<long long>(T), loss,
              std::exp(loss), loss / std::log(2.0));
  return 0;
}

const CommandRegistration reg({"eval", "validation loss and perplexity of a model", 12, run_eval});

}  // namespace

}  // namespace diffattn::cli
