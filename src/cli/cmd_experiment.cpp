// `diffattn experiment retrieval`: DIFF V1, DIFF V2 and standard models trained on the same
// multi-needle retrieval batches, evaluated on held-out samples, reported (src/eval/experiment.cpp).
// `diffattn experiment lm`: the paired language-model experiment (src/eval/lm_experiment.cpp).
// `diffattn analyze`: the attention-noise analysis (inspect.h) of any saved model on the
// retrieval task's held-out contexts.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <sstream>

#include "cli/args.h"
#include "cli/table.h"
#include "diffattn/eval/experiment.h"
#include "diffattn/eval/lm_experiment.h"
#include "diffattn/kernels/runtime.h"
#include "diffattn/model/checkpoint.h"
#include "diffattn/model/train_context.h"

namespace diffattn::cli {

namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) {
    if (!cur.empty()) out.push_back(cur);
  }
  return out;
}

std::vector<int64_t> int_list(const std::string& flag, const std::string& s) {
  std::vector<int64_t> out;
  for (const std::string& x : split(s, ',')) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(x, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != x.size() || v <= 0) throw UsageError(flag + ": \"" + x + "\" is not a positive integer");
    out.push_back(v);
  }
  if (out.empty()) throw UsageError(flag + " is empty");
  return out;
}

std::vector<double> depth_list(const std::string& s) {
  std::vector<double> out;
  for (const std::string& x : split(s, ',')) {
    size_t used = 0;
    double v = -1;
    try {
      v = std::stod(x, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != x.size() || !(v >= 0.0 && v <= 1.0)) {
      throw UsageError("--depths: \"" + x + "\" is not a number in [0, 1]");
    }
    out.push_back(v);
  }
  if (out.empty()) throw UsageError("--depths is empty");
  return out;
}

// The task options shared by `experiment retrieval` and `analyze`.
void task_options(Args& a, bool with_defaults) {
  const data::RetrievalSpec d;
  auto def = [&](int64_t v) { return with_defaults ? std::to_string(v) : std::string(); };
  a.option("--context", "C", def(d.context), "tokens of context (filler and needles) before the queries")
      .option("--needles", "N", def(d.needles), "key-value needles per context")
      .option("--queries", "R", def(d.queries), "needles asked for at the end")
      .option("--near-misses", "M", def(d.near_misses),
              "unqueried needles whose key differs from a queried key in one symbol (-1: all N - R)")
      .option("--key-len", "K", def(d.key_len), "symbols per key")
      .option("--key-symbols", "S", def(d.key_symbols), "alphabet of keys (A.., at most 26)")
      .option("--value-symbols", "S", def(d.value_symbols), "alphabet of values (0.., at most 10)");
}

void apply_task_options(const Args& a, data::RetrievalSpec& s) {
  auto set = [&](const char* flag, int64_t& field) {
    if (a.given(flag) || !a.str(flag).empty()) field = a.integer(flag);
  };
  set("--context", s.context);
  set("--needles", s.needles);
  set("--queries", s.queries);
  set("--near-misses", s.near_misses);
  set("--key-len", s.key_len);
  set("--key-symbols", s.key_symbols);
  set("--value-symbols", s.value_symbols);
}

int run_lm(const std::vector<std::string>& argv) {
  Args a("experiment lm",
         "The paired language-model experiment at CPU scale (bench/gpu_experiment.py is its GPU twin).\n"
         "DIFF V1, DIFF V2 and standard models of (nearly) equal parameters, for each seed initialised in\n"
         "pairs (every tensor of the same name and shape byte-identical across the three, checked) and\n"
         "trained on the same windows of the corpus in the same order; then on the held-out documents:\n"
         "loss per document, the paired difference per document with a 95% Student-t interval over\n"
         "documents (per seed and averaged over seeds), the same by position bucket, lambda per layer.\n"
         "The corpus is scripts/corpus.py's (`make corpus`, docs/corpus.md). Writes DIR/report.md,\n"
         "report.json, loss_by_position.png and training_loss.png.");
  a.positional("name", "the experiment: lm")
      .option("--corpus", "DIR", "data/corpus", "train.jsonl and heldout.jsonl of scripts/corpus.py")
      .option("--out", "DIR", "lm-experiment", "directory for the report")
      .option("--seeds", "N,N,..", "1,2,3", "seeds (each: the weights and the data order)")
      .option("--steps", "N", "300", "training steps per model")
      .option("--batch", "B", "8", "sequences per step")
      .option("--seq-len", "T", "128", "bytes per sequence")
      .option("--lr", "X", "0.003", "peak learning rate (warmup, cosine decay to lr / 10)")
      .option("--warmup", "N", "", "warmup steps (default: 30, at most a tenth of --steps)")
      .option("--weight-decay", "X", "0.1", "AdamW weight decay")
      .option("--d-model", "D", "64", "model width")
      .option("--layers", "L", "2", "layers")
      .option("--heads", "H", "4", "standard heads (DIFF V1: H / 2 pairs; V2: H heads, 2H query heads)")
      .option("--ffn", "F", "176", "SwiGLU width of the standard and V1 models (V2: smaller, to match)")
      .option("--init-std", "X", "0.02", "std of the initial weights (not the norms, not V1's lambda vectors)")
      .option("--eval-windows", "N", "4", "windows of --seq-len per held-out document")
      .option("--max-docs", "N", "0", "read at most N documents of each split (0: all)");
  if (!a.parse(argv)) return 0;
  eval::LmExperimentOptions o;
  o.corpus_dir = a.str("--corpus");
  o.seeds.clear();
  for (int64_t s : int_list("--seeds", a.str("--seeds"))) {
    for (uint64_t t : o.seeds) {
      if (t == static_cast<uint64_t>(s)) throw UsageError("--seeds: " + std::to_string(s) + " given twice");
    }
    o.seeds.push_back(static_cast<uint64_t>(s));
  }
  o.train.steps = a.integer("--steps", 1, 100000000);
  o.train.batch = a.integer("--batch", 1, 1 << 20);
  o.train.seq_len = a.integer("--seq-len", 2, 1 << 20);
  o.train.adamw.lr = a.number("--lr", 0, 10);
  o.train.adamw.min_lr = o.train.adamw.lr / 10;
  o.train.adamw.warmup = a.given("--warmup") ? a.integer("--warmup", 0, o.train.steps)
                                              : std::min<int64_t>(30, o.train.steps / 10);
  o.train.adamw.weight_decay = a.number("--weight-decay", 0, 10);
  o.size.d_model = a.integer("--d-model", 1, 1 << 16);
  o.size.n_layers = a.integer("--layers", 1, 1024);
  o.size.n_heads = a.integer("--heads", 1, 1024);
  o.size.ffn_dim = a.integer("--ffn", 1, 1 << 20);
  o.size.max_seq_len = o.train.seq_len;
  o.init_std = a.number("--init-std", 1e-6, 10);
  o.eval_windows = a.integer("--eval-windows", 1, 1 << 20);
  o.max_docs = a.integer("--max-docs", 0, int64_t{1} << 40);
  const std::string out = a.str("--out");
  if (out.empty()) throw UsageError("--out DIR must not be empty");
  eval::LmExperimentResult r = eval::run_lm_experiment(o, [](const std::string& s) { std::cout << s << std::endl; });
  const std::vector<std::string> files = eval::write_lm_report(r, out);
  std::cout << "\n";
  for (const eval::LmPaired& p : r.paired) {
    std::cout << nn::attn_kind_name(p.a) << " - " << nn::attn_kind_name(p.b) << ": " << fixed(p.pooled.mean, 4)
              << " nats per byte, 95% interval over documents [" << fixed(p.pooled.lo, 4) << ", "
              << fixed(p.pooled.hi, 4) << "]\n";
  }
  for (const std::string& f : files) std::cout << "wrote " << f << "\n";
  return 0;
}

int run_experiment(const std::vector<std::string>& argv) {
  if (!argv.empty() && argv[0] == "lm") return run_lm(argv);
  Args a("experiment",
         "Experiments on trained models. `experiment retrieval`: multi-needle key retrieval after\n"
         "arXiv:2410.05258 section 3.4. Contexts of C tokens of filler (a..z) hold N needles\n"
         "\"#KEYv\" (a key of K capitals, a value digit); R keys are then asked for (\"?KEY\" -> v);\n"
         "near-miss needles carry a queried key with one symbol changed and another value. DIFF V1,\n"
         "DIFF V2 and standard models of (nearly) equal parameters are trained with the same seed on\n"
         "the same batches (loss on answer tokens only), then scored on held-out samples by context\n"
         "length and by the depth of the queried needle, with the attention-noise analysis (the\n"
         "paper's Table 3 measure). Training contexts are drawn from [--min-context, --context].\n"
         "Writes DIR/report.md, PNG charts and heatmaps, and DIR/models/{diff_v1,diff_v2,standard}.\n"
         "`experiment lm`: the paired language-model experiment (see `experiment lm --help`).");
  a.positional("name", "the experiment: retrieval (or lm)")
      .option("--out", "DIR", "retrieval", "directory for the report and the models");
  task_options(a, true);
  a.option("--min-context", "C", "32", "shortest training context (0: always --context)")
      .option("--lengths", "C,C,..", "32,48,64,96", "contexts to evaluate (may exceed --context)")
      .option("--depths", "D,D,..", "0,0.25,0.5,0.75,1", "needle depths to evaluate (0: start, 1: end)")
      .option("--depth-context", "C", "0", "context of the depth evaluation (0: --context)")
      .option("--steps", "N", "1500", "training steps per model")
      .option("--batch", "B", "16", "sequences per step")
      .option("--lr", "X", "0.003", "peak learning rate (warmup, cosine decay to lr / 10)")
      .option("--warmup", "N", "30", "warmup steps")
      .option("--weight-decay", "X", "0.0", "AdamW weight decay")
      .option("--d-model", "D", "64", "model width")
      .option("--layers", "L", "2", "layers")
      .option("--heads", "H", "4", "standard heads (DIFF V1: H / 2 pairs; V2: H heads, 2H query heads)")
      .option("--ffn", "F", "176", "SwiGLU width of the standard and V1 models (V2: smaller, to match)")
      .option("--init-std", "X", "0.02", "std of the initial projection weights")
      .option("--eval-samples", "N", "256", "held-out samples per length and per depth")
      .option("--noise-samples", "N", "64", "held-out samples for the attention-noise analysis")
      .option("--kinds", "K,K,..", "diff_v1,diff_v2,standard", "attention kinds to train")
      .option("--seed", "N", "1", "seed of the task and the weights")
      .option("--seeds", "N,N,..", "",
              "several seeds: one run each in DIR/seed-N/ from paired weights (every tensor of the same "
              "name and shape byte-identical across the kinds), then DIR/summary.md and summary.json: "
              "accuracy with 95% intervals against chance, paired differences over seeds");
  if (!a.parse(argv)) return 0;
  if (a.str("name") != "retrieval") {
    throw UsageError("unknown experiment \"" + a.str("name") + "\"; the experiments are: retrieval, lm");
  }
  eval::RetrievalExperimentOptions o;
  apply_task_options(a, o.task);
  o.task.min_context = a.integer("--min-context");
  if (o.task.min_context >= o.task.context) o.task.min_context = 0;
  o.task.seed = static_cast<uint64_t>(a.integer("--seed"));
  o.lengths = int_list("--lengths", a.str("--lengths"));
  o.depths = depth_list(a.str("--depths"));
  o.depth_context = a.integer("--depth-context");
  o.eval_samples = a.integer("--eval-samples");
  o.noise_samples = a.integer("--noise-samples");
  if (o.eval_samples < 1 || o.noise_samples < 1) throw UsageError("--eval-samples and --noise-samples must be >= 1");
  o.size.d_model = a.integer("--d-model", 1, 1 << 18);
  o.size.n_layers = a.integer("--layers", 1, 1 << 16);
  o.size.n_heads = a.integer("--heads", 1, 1 << 16);
  o.size.ffn_dim = a.integer("--ffn", 1, 1 << 20);
  o.size.max_seq_len = 0;  // from the longest sample
  o.init_std = a.number("--init-std");
  if (!(o.init_std > 0)) throw UsageError("--init-std must be > 0");
  o.train.steps = a.integer("--steps");
  o.train.batch = a.integer("--batch");
  if (o.train.steps < 1 || o.train.batch < 1) throw UsageError("--steps and --batch must be >= 1");
  o.train.adamw.lr = a.number("--lr");
  o.train.adamw.min_lr = o.train.adamw.lr / 10;
  o.train.adamw.warmup = a.integer("--warmup");
  o.train.adamw.weight_decay = a.number("--weight-decay");
  o.kinds.clear();
  for (const std::string& k : split(a.str("--kinds"), ',')) {
    o.kinds.push_back(from_flags([&] { return model::parse_attn_kind(k, "--kinds"); }));
  }
  if (o.kinds.empty()) throw UsageError("--kinds is empty");
  o.out_dir = a.str("--out");
  if (o.out_dir.empty()) throw UsageError("--out DIR must not be empty");
  o.progress = true;  // a bar on stderr while each model trains, when it is a terminal

  from_flags([&] { o.task.validate(); });
  if (a.given("--seeds")) {
    std::vector<eval::RetrievalExperimentResult> runs;
    const std::string root = o.out_dir;
    const std::vector<int64_t> seeds = int_list("--seeds", a.str("--seeds"));
    for (size_t i = 0; i < seeds.size(); ++i) {
      if (std::find(seeds.begin(), seeds.begin() + static_cast<std::ptrdiff_t>(i), seeds[i]) !=
          seeds.begin() + static_cast<std::ptrdiff_t>(i)) {
        throw UsageError("--seeds: " + std::to_string(seeds[i]) + " given twice");
      }
    }
    for (int64_t s : seeds) {
      o.task.seed = static_cast<uint64_t>(s);
      o.paired_init = true;
      o.out_dir = root + "/seed-" + std::to_string(s);
      std::cout << "seed " << s << ":\n";
      runs.push_back(eval::run_retrieval_experiment(o, [](const std::string& line) { std::cout << line << std::endl; }));
      eval::write_retrieval_report(runs.back(), o.out_dir);
    }
    for (const std::string& f : eval::write_retrieval_seed_summary(runs, root)) std::cout << "wrote " << f << "\n";
    return 0;
  }
  std::cout << "Multi-needle retrieval: " << data::RetrievalTask(o.task).describe() << ", " << kernels::num_threads()
            << " thread(s)\n"
            << "sample: " << data::make_retrieval_sample(o.task, 0).text() << "\n";
  eval::RetrievalExperimentResult r = eval::run_retrieval_experiment(o, [](const std::string& s) { std::cout << s << std::endl; });
  std::cout << "\n";
  eval::print_retrieval_tables(std::cout, r);
  const std::vector<std::string> files = eval::write_retrieval_report(r, o.out_dir);
  std::cout << "\nwrote the report and " << files.size() - 1 << " pictures/arrays into " << o.out_dir << "/:\n";
  for (const std::string& f : files) std::cout << "  " << f << "\n";
  for (const eval::RetrievalModelResult& m : r.models) std::cout << "  " << m.dir << "/ (model)\n";
  return 0;
}

int run_analyze(const std::vector<std::string>& argv) {
  Args a("analyze",
         "Attention noise of a trained model (arXiv:2410.05258 Table 3's measure) on held-out\n"
         "multi-needle retrieval contexts: for each query's answer row, the share of the row's\n"
         "absolute attention mass on the queried needle (answer), the signed share on the rest of\n"
         "the context (noise; negative weights of A1 - lambda A2 cancel positive ones) and its\n"
         "absolute share (noise |w|), per layer and averaged, for the differential map and map 1\n"
         "alone (DIFF) or the softmax map (standard); the lambda per layer (V2: mean over the answer\n"
         "rows of sigmoid(lambda_proj x)). The task is read from DIR/retrieval.json (written by\n"
         "`experiment retrieval`) unless flags override it; the held-out seed is never a training one.");
  a.option("--model", "DIR", "", "model directory (required)")
      .option("--samples", "N", "64", "held-out contexts");
  task_options(a, false);
  if (!a.parse(argv)) return 0;
  if (!a.given("--model")) throw UsageError("--model DIR is required");
  const std::string dir = a.str("--model");
  const int64_t samples = a.integer("--samples");
  if (samples < 1) throw UsageError("--samples must be >= 1");
  const model::Model m = model::load_model(dir);
  model::TrainContext run(m);
  data::RetrievalSpec spec = data::read_retrieval_spec(dir).value_or(data::RetrievalSpec{});
  apply_task_options(a, spec);
  spec.min_context = 0;
  spec = eval::heldout(spec);
  const eval::NoiseAnalysis r = eval::analyze_noise(run, spec, samples);
  const bool pair = r.kind != nn::AttnKind::Standard;
  std::cout << nn::attn_kind_name(r.kind) << " model " << dir << ": " << plural(r.samples, "held-out context") << " of "
            << plural(spec.context, "token") << ", " << plural(r.rows, "answer row") << ", answer accuracy " << fixed(100 * r.accuracy, 1)
            << "%\n";
  std::vector<std::vector<std::string>> rows;
  auto add = [&](const std::string& layer, const char* map, const eval::NoiseStats& s, double lam) {
    rows.push_back({layer, map, fixed(s.answer, 3), fixed(s.noise, 3), fixed(s.noise_abs, 3),
                    std::isnan(lam) ? std::string("-") : fixed(lam, 3)});
  };
  for (const eval::NoiseLayer& l : r.layers) {
    add(std::to_string(l.layer), pair ? "A1 - lambda A2" : "softmax", l.main, l.lambda);
    if (pair) add(std::to_string(l.layer), "A1 alone", l.map1, std::nan(""));
  }
  add("mean", pair ? "A1 - lambda A2" : "softmax", r.mean_main, std::nan(""));
  if (pair) add("mean", "A1 alone", r.mean_map1, std::nan(""));
  print_table(std::cout, {"layer", "map", "answer", "noise", "noise |w|", "lambda"}, rows);
  std::cout << "shares of the answer rows' absolute attention mass, averaged over heads and rows\n";
  return 0;
}

const CommandRegistration reg_experiment({"experiment",
                                          "retrieval, lm: DIFF V1, V2 and standard trained and compared (report)",
                                          15, run_experiment});
const CommandRegistration reg_analyze({"analyze", "attention noise of a trained model on retrieval contexts",
                                       16, run_analyze});

}  // namespace

}  // namespace diffattn::cli
