// `diffattn train`: trains a Differential Transformer (V1, V2) or its standard twin on the KJV
// corpus (or any text file) from a preset, flags or a JSON config; resumable with --resume.
// `--bench N` times N training steps on the preset instead (no files written;
// bench/runner/train_bench.h).
#include <sys/stat.h>

#include <chrono>
#include <cstdint>
#include <cmath>
#include <memory>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <nlohmann/json.hpp>

#include "diffattn/base/json_util.h"
#include "bench/runner/train_bench.h"
#include "cli/args.h"
#include "diffattn/base/files.h"
#include "diffattn/kernels/runtime.h"
#include "diffattn/model/checkpoint.h"
#include "diffattn/train/train.h"

namespace diffattn::cli {

namespace {

using json = nlohmann::json;

// Upper bound of the count flags (steps, batch, ...): far beyond any real run, small enough that
// products of a few of them cannot wrap; the memory a step needs is checked by the library.
constexpr int64_t kBig = int64_t{1} << 40;

bool exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
}

void print_summary(std::ostream& os, const model::Model& m, const train::TrainOptions& o,
                   const std::string& data_desc) {
  const model::ModelConfig& c = m.config();
  os << "model: " << nn::attn_kind_name(c.attention) << ", " << c.n_layers << " layers, d_model "
     << c.d_model << ", heads " << c.n_heads << " (kv " << c.n_kv_heads << "), head_dim "
     << c.head_dim << ", ffn_dim " << c.ffn_dim << ", vocab " << c.vocab_size << ", "
     << m.num_params() << " parameters\n"
     << "train: " << o.steps << " steps x " << o.accum << " x (" << o.batch << " x " << o.seq_len
     << ") tokens, lr " << o.adamw.lr << " (warmup " << o.adamw.warmup << ", cosine to "
     << o.adamw.min_lr << "), weight decay " << o.adamw.weight_decay << ", clip " << o.adamw.clip
     << ", seed " << o.seed << ", threads " << kernels::num_threads() << "\n"
     << "data: " << data_desc << "\n";
}

// On --resume the run's own options (saved in train_state.safetensors) are used. Flags that only
// say how long to run and how often to evaluate or save may change (--steps, --eval-every,
// --eval-batches, --save-every); a flag that would change the numbers of the steps already
// taken is an error naming it and the run's value, unless it repeats that value.
void check_resume_flags(const Args& a, const train::TrainOptions& o, const train::TrainOptions& run) {
  auto same = [&](const char* flag, bool equal, const std::string& was) {
    if (a.given(flag) && !equal) {
      throw UsageError(std::string(flag) + " cannot change on --resume (the run was started with " +
                       was + "); only --steps, --eval-every, --eval-batches and --save-every can");
    }
  };
  auto num = [](double x) { std::ostringstream os; os << x; return os.str(); };
  same("--batch", o.batch == run.batch, std::to_string(run.batch));
  same("--seq-len", o.seq_len == run.seq_len, std::to_string(run.seq_len));
  same("--accum", o.accum == run.accum, std::to_string(run.accum));
  same("--lr", o.adamw.lr == run.adamw.lr, num(run.adamw.lr));
  same("--min-lr", o.adamw.min_lr == run.adamw.min_lr, num(run.adamw.min_lr));
  same("--warmup", o.adamw.warmup == run.adamw.warmup, std::to_string(run.adamw.warmup));
  same("--weight-decay", o.adamw.weight_decay == run.adamw.weight_decay, num(run.adamw.weight_decay));
  same("--clip", o.adamw.clip == run.adamw.clip, num(run.adamw.clip));
  same("--seed", o.seed == run.seed, std::to_string(run.seed));
  same("--corpus", o.corpus == run.corpus, run.corpus);
  same("--tokenizer", o.tokenizer == run.tokenizer, run.tokenizer);
  for (const char* flag : {"--config", "--init", "--preset", "--attention", "--vocab-size"}) {
    if (a.given(flag)) {
      throw UsageError(std::string(flag) + " cannot be used with --resume: the run's model and "
                       "options come from its train_state.safetensors");
    }
  }
}

int run_train(const std::vector<std::string>& argv) {
  Args a("train",
         "Train a language model: DIFF V1, DIFF V2 or a standard Transformer of equal size, on the\n"
         "King James Bible (Debian's bible-kjv) or a text file, with AdamW, warmup + cosine decay,\n"
         "gradient clipping and accumulation. Writes DIR/config.json + model.safetensors (the model),\n"
         "DIR/train_state.safetensors (the resume point) and DIR/train_log.jsonl (one line a step).");
  a.option("--out", "DIR", "", "model directory to write (required unless --bench)")
      .option("--preset", "NAME", "tiny", "model size: tiny or small")
      .option("--attention", "KIND", "diff_v1", "diff_v1, diff_v2 or standard")
      .option("--config", "FILE", "",
              "JSON: {\"preset\", \"attention\", \"model\": {config.json keys}, and any training "
              "key: steps, batch, seq_len, accum, lr, min_lr, warmup, beta1, beta2, eps, "
              "weight_decay, clip, seed, eval_every, eval_batches, save_every, corpus, "
              "tokenizer}; flags given on the command line win")
      .option("--steps", "N", "200", "optimizer steps")
      .option("--batch", "B", "8", "sequences per micro-batch")
      .option("--seq-len", "T", "128", "tokens per sequence")
      .option("--accum", "N", "1", "micro-batches per step (gradient accumulation)")
      .option("--lr", "X", "0.001", "peak learning rate")
      .option("--min-lr", "X", "0.0001", "learning rate at the end of the cosine decay")
      .option("--warmup", "N", "20", "linear warmup steps")
      .option("--weight-decay", "X", "0.1", "AdamW decoupled weight decay (2-D tensors only)")
      .option("--clip", "X", "1.0", "clip the global gradient norm to X (0: off)")
      .option("--seed", "N", "1", "seed of the weights and of the batches")
      .option("--corpus", "SPEC", "kjv", "kjv (the King James Bible) or the path of a text file")
      .option("--tokenizer", "KIND", "bytes",
              "bytes, or sentencepiece (trained on the corpus, saved as DIR/tokenizer.model)")
      .option("--vocab-size", "N", "1024", "SentencePiece vocabulary size")
      .option("--eval-every", "N", "0", "validation loss every N steps (0: at the end only)")
      .option("--eval-batches", "N", "8", "validation batches per evaluation")
      .option("--save-every", "N", "50", "write the resume point every N steps")
      .option("--init", "DIR", "", "start from this model directory's weights and config "
              "(and its tokenizer.model) instead of a preset")
      .flag("--resume", "continue the run in --out from its train_state.safetensors, with its "
            "saved options; --steps (to train further), --eval-every, --eval-batches and "
            "--save-every may change, any other training flag that differs is an error")
      .flag("--no-progress", "no progress bar on stderr")
      .option("--bench", "N", "0", "time N training steps on random tokens and print tokens/s");
  if (!a.parse(argv)) return 0;

  json cfgj = json::object();
  if (a.given("--config")) {
    cfgj = parse_json_object(read_file(a.str("--config"), kMaxJsonFileBytes), a.str("--config"));
  }
  auto from_cfg = [&](const char* key, const std::string& flag) -> std::string {
    if (!a.given(flag) && cfgj.contains(key)) {
      const json v = cfgj.at(key);
      cfgj.erase(key);
      if (!v.is_string()) throw InvalidArgument(a.str("--config") + ": \"" + key + "\" must be a string");
      return v.get<std::string>();
    }
    cfgj.erase(key);
    return a.str(flag);
  };
  const std::string preset = from_cfg("preset", "--preset");
  const std::string attention = from_cfg("attention", "--attention");
  json model_j;
  if (cfgj.contains("model")) {
    model_j = cfgj.at("model");
    cfgj.erase("model");
  }

  train::TrainOptions o = train::TrainOptions::from_json(cfgj.dump(), a.given("--config") ? a.str("--config") : "config");
  // JSON keys use underscores; flags use dashes.
  auto has = [&](const char* key) { return cfgj.contains(key); };
  if (a.given("--steps") || !has("steps")) o.steps = a.integer("--steps", 1, kBig);
  if (a.given("--batch") || !has("batch")) o.batch = a.integer("--batch", 1, kBig);
  if (a.given("--seq-len") || !has("seq_len")) o.seq_len = a.integer("--seq-len", 1, kBig);
  if (a.given("--accum") || !has("accum")) o.accum = a.integer("--accum", 1, kBig);
  if (a.given("--lr") || !has("lr")) o.adamw.lr = a.number("--lr", 1e-30, 1e30);
  if (a.given("--min-lr") || !has("min_lr")) o.adamw.min_lr = a.number("--min-lr", 0, 1e30);
  if (a.given("--warmup") || !has("warmup")) o.adamw.warmup = a.integer("--warmup", 0, kBig);
  if (a.given("--weight-decay") || !has("weight_decay")) o.adamw.weight_decay = a.number("--weight-decay", 0, 1e30);
  if (a.given("--clip") || !has("clip")) o.adamw.clip = a.number("--clip", 0, 1e30);
  if (a.given("--seed") || !has("seed")) o.seed = static_cast<uint64_t>(a.integer("--seed", 0, INT64_MAX));
  if (a.given("--eval-every") || !has("eval_every")) o.eval_every = a.integer("--eval-every", 0, kBig);
  if (a.given("--eval-batches") || !has("eval_batches")) o.eval_batches = a.integer("--eval-batches", 1, kBig);
  if (a.given("--save-every") || !has("save_every")) o.save_every = a.integer("--save-every", 0, kBig);
  if (a.given("--corpus") || !has("corpus")) o.corpus = a.str("--corpus");
  if (a.given("--tokenizer") || !has("tokenizer")) o.tokenizer = a.str("--tokenizer");
  if (o.tokenizer != "bytes" && o.tokenizer != "sentencepiece") {
    throw UsageError("--tokenizer is \"" + o.tokenizer + "\", expected bytes or sentencepiece");
  }

  const nn::AttnKind kind = from_flags([&] { return model::parse_attn_kind(attention, "--attention"); });
  if (a.given("--preset")) from_flags([&] { model::model_preset(preset, kind); });
  const int64_t bench_steps = a.integer("--bench", 0, kBig);
  const int64_t vocab_size = a.integer("--vocab-size", 2, 1 << 20);
  if (bench_steps > 0) {
    model::ModelConfig cfg = model_j.is_null() ? model::model_preset(preset, kind)
                                        : model::ModelConfig::from_json(model_j.dump(), "--config model");
    return bench::run_train_bench(cfg, train::TrainOptions(o), bench_steps);
  }
  if (!a.given("--out")) throw UsageError("--out DIR is required (the model directory to write)");
  const std::string dir = a.str("--out");
  const std::string cache = data::default_cache_dir();

  std::unique_ptr<train::Trainer> tr;
  std::unique_ptr<data::Tokenizer> tok;
  data::Corpus corpus;
  if (a.on("--resume")) {
    tr = std::make_unique<train::Trainer>(train::Trainer::resume(dir));
    check_resume_flags(a, o, tr->options());
    tr->set_schedule(a.given("--steps") ? o.steps : tr->options().steps,
                     a.given("--eval-every") ? o.eval_every : tr->options().eval_every,
                     a.given("--eval-batches") ? o.eval_batches : tr->options().eval_batches,
                     a.given("--save-every") ? o.save_every : tr->options().save_every);
    if (tr->steps_done() >= tr->options().steps) {
      // A kill after the last resume point and before the model files that follow it leaves
      // the model of the step before: the resume point's model is written out first.
      tr->model_files.replace_tokenizer = true;
      if (exists(dir + "/tokenizer.model")) tr->model_files.extra["tokenizer.model"] = read_file(dir + "/tokenizer.model");
      model::save_model(tr->model(), dir, DType::F32, tr->model_files);
      throw UsageError(dir + " is already at step " + std::to_string(tr->steps_done()) + " of " +
                       std::to_string(tr->options().steps) +
                       " (its model files are that step's); pass --steps N with N larger to train further");
    }
    corpus = data::load_corpus(tr->options().corpus, cache);
    tok = data::tokenizer_for(dir);
    std::cerr << "resuming " << dir << " at step " << tr->steps_done() << "\n";
  } else {
    if (exists(dir + "/train_state.safetensors")) {
      throw UsageError(dir + " already holds a training run; pass --resume to continue it, or "
                       "choose another --out");
    }
    // A run writes its tokenizer into --out before its first checkpoint: beside another model,
    // that model would read with the wrong tokenizer. And a new run would replace it.
    if (exists(dir + "/config.json")) {
      throw UsageError(dir + " already holds a model (config.json); choose another --out for a new "
                       "run (--init DIR starts from that model)");
    }
    corpus = data::load_corpus(o.corpus, cache);
    if (a.given("--init")) {
      const std::string init = a.str("--init");
      model::Model m = model::load_model(init);
      tok = data::tokenizer_for(init);
      make_dirs(dir);
      if (tok->name() == "sentencepiece") {
        write_file_atomic(dir + "/tokenizer.model", read_file(init + "/tokenizer.model"));
        o.tokenizer = "sentencepiece";
      } else {
        o.tokenizer = "bytes";
      }
      if (m.config().vocab_size != tok->vocab_size()) {
        throw InvalidArgument(init + ": config vocab_size = " + std::to_string(m.config().vocab_size) +
                              " but the " + tok->name() + " tokenizer has " +
                              std::to_string(tok->vocab_size()) + " tokens");
      }
      tr = std::make_unique<train::Trainer>(dir, std::move(m), o);
    } else {
      if (o.tokenizer == "sentencepiece") {
        make_dirs(dir);
        std::cerr << "training a SentencePiece tokenizer (" << vocab_size
                  << " pieces) on " << corpus.name << "...\n";
        data::train_sentencepiece(corpus.train, dir + "/tokenizer.model",
                                  vocab_size, static_cast<uint32_t>(o.seed));
        tok = data::load_sentencepiece(dir + "/tokenizer.model");
      } else {
        tok = data::byte_tokenizer();
      }
      const model::ModelConfig cfg =
          model_j.is_null()
              ? model::model_preset(preset, kind, tok->vocab_size())
              : model::ModelConfig::from_json(model_j.dump(), a.str("--config") + " (model)");
      if (cfg.vocab_size != tok->vocab_size()) {
        throw InvalidArgument("config vocab_size = " + std::to_string(cfg.vocab_size) +
                              " but the " + tok->name() + " tokenizer has " +
                              std::to_string(tok->vocab_size()) + " tokens");
      }
      tr = std::make_unique<train::Trainer>(dir, cfg, o);
    }
  }
  // The run's tokenizer goes with every save of its model (none: a byte-level model).
  tr->model_files.replace_tokenizer = true;
  if (tok->name() == "sentencepiece") tr->model_files.extra["tokenizer.model"] = read_file(dir + "/tokenizer.model");
  const data::TokenWindows train(tok->encode(corpus.train), tr->options().seed, corpus.name + " train");
  const std::vector<int32_t> valid = tok->encode(corpus.valid);
  print_summary(std::cerr, tr->model(), tr->options(), train.describe() + ", " + tok->name() + " tokenizer");
  tr->progress = !a.on("--no-progress");
  train::StepLog last;
  tr->run(train, &valid, 0, [&](const train::StepLog& s) { last = s; });
  const int64_t T = tr->options().seq_len;
  if (static_cast<int64_t>(valid.size()) > T) {
    const double val = data::eval_loss(tr->context(), valid, tr->options().batch, T,
                                       tr->options().eval_batches);
    std::printf("step %lld  train loss %.4f  val loss %.4f  val ppl %.2f  -> %s\n",
                static_cast<long long>(tr->steps_done()), last.loss, val, std::exp(val), dir.c_str());
  } else {
    std::printf("step %lld  train loss %.4f  (validation split too short for T = %lld)  -> %s\n",
                static_cast<long long>(tr->steps_done()), last.loss, static_cast<long long>(T),
                dir.c_str());
  }
  return 0;
}

const CommandRegistration reg({"train", "train a DIFF V1 / V2 or standard language model", 11,
                               run_train});

}  // namespace

}  // namespace diffattn::cli
