// The demo's language-model section: a tiny Differential Transformer (V1) and the standard
// Transformer of equal size, trained side by side on the same batches of the King James Bible,
// then asked to continue the same prompt.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>

#include "cli/demo.h"
#include "cli/progress.h"
#include "cli/table.h"
#include "diffattn/kernels/runtime.h"
#include "diffattn/train/train.h"

namespace diffattn::cli {

void demo_language_model(std::ostream& os, int section, int64_t steps) {
  const int64_t kSteps = steps;
  const int64_t kEvery = std::max<int64_t>(1, kSteps / 10);
  train::TrainOptions o;
  o.steps = kSteps;
  o.batch = 8;
  o.seq_len = 128;
  o.adamw.lr = 3e-3;
  o.adamw.min_lr = 3e-4;
  o.adamw.warmup = std::min<int64_t>(100, kSteps / 2);
  o.seed = 1;
  const data::Corpus corpus = data::load_corpus("kjv", data::default_cache_dir());
  const auto tok = data::byte_tokenizer();
  const data::TokenWindows train(tok->encode(corpus.train), o.seed, "kjv train");
  const std::vector<int32_t> valid = tok->encode(corpus.valid);

  os << "\n== " << section
     << ". A tiny Differential Transformer and its standard twin on the King James Bible ==\n\n"
        "Both models: preset \"tiny\" (2 layers, d_model 64), byte-level, the same seed, the same\n"
        "batches (" << o.batch << " x " << o.seq_len << " bytes), AdamW, lr " << o.adamw.lr
     << " with warmup and cosine decay, " << kSteps << " steps,\n"
     << kernels::num_threads() << " thread(s). DIFF V1 has 2 pairs of 2 x 16-dim sub-heads, the standard "
        "model 4 heads of 16.\nCorpus: Debian's bible-kjv, every 20th verse held out for "
        "validation.\n\n";

  struct Run {
    const char* label;
    std::unique_ptr<train::Trainer> tr;
    std::vector<double> curve;
    double seconds = 0, val = 0;
  };
  Run runs[2] = {{"DIFF V1", nullptr, {}, 0, 0}, {"standard", nullptr, {}, 0, 0}};
  const nn::AttnKind kinds[2] = {nn::AttnKind::DiffV1, nn::AttnKind::Standard};
  for (int r = 0; r < 2; ++r) {
    runs[r].tr = std::make_unique<train::Trainer>("", model::model_preset("tiny", kinds[r]), o);
    const auto t0 = std::chrono::steady_clock::now();
    double acc = 0;
    // The curve's rows come only at the end: a progress bar on stderr meanwhile, as `train` has.
    ProgressBar bar(std::string(runs[r].label) + " (" + std::to_string(r + 1) + " of 2)", kSteps);
    for (int64_t s = 0; s < kSteps; ++s) {
      const double loss = runs[r].tr->step(train).loss;
      bar.update(s + 1, loss);
      acc += loss;
      if ((s + 1) % kEvery == 0) {
        runs[r].curve.push_back(acc / kEvery);
        acc = 0;
      }
    }
    bar.done();
    runs[r].seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    runs[r].val = data::eval_loss(runs[r].tr->context(), valid, o.batch, o.seq_len, 16);
  }

  std::vector<std::vector<std::string>> rows;
  for (size_t i = 0; i < runs[0].curve.size(); ++i) {
    rows.push_back({std::to_string((i + 1) * kEvery), fixed(runs[0].curve[i], 3), fixed(runs[1].curve[i], 3)});
  }
  rows.push_back({"val loss", fixed(runs[0].val, 3), fixed(runs[1].val, 3)});
  rows.push_back({"val bits/byte", fixed(runs[0].val / std::log(2.0), 3), fixed(runs[1].val / std::log(2.0), 3)});
  rows.push_back({"parameters", std::to_string(runs[0].tr->model().num_params()),
                  std::to_string(runs[1].tr->model().num_params())});
  rows.push_back({"seconds", fixed(runs[0].seconds, 1), fixed(runs[1].seconds, 1)});
  os << "Training loss (mean of the last " << kEvery << " steps):\n";
  print_table(os, {"step", "DIFF V1", "standard"}, rows);

  const std::vector<double> lam = runs[0].tr->context().layer_lambdas();
  os << "\nDIFF V1's lambda per layer after training:";
  const model::ModelConfig& c1 = runs[0].tr->model().config();
  for (size_t l = 0; l < lam.size(); ++l) {
    os << (l ? ", " : " ") << "layer " << l << " = " << fixed(lam[l], 3) << " (init "
       << fixed(c1.layer_lambda_init(static_cast<int64_t>(l)), 3) << ")";
  }
  os << "\n";

  infer::GenerateOptions g;
  g.max_new = 160;
  g.sampler.temperature = 0.7;
  g.sampler.top_k = 40;
  g.sampler.seed = 7;
  const std::string prompt = "And God said";
  for (Run& r : runs) {
    os << "\n" << r.label << " continues \"" << prompt << "\" (temperature 0.7, top-k 40, seed 7):\n  " << prompt;
    const std::string text = train::generate(r.tr->model(), *tok, prompt, g);
    for (char c : text) {
      os << c;
      if (c == '\n') os << "  ";
    }
    os << "\n";
  }
  os << "\n(About a minute of training on bytes: words and the rhythm of the verses begin to show.\n"
        "The paper compares models from 830M parameters up; at this size and length either may\n"
        "lead. Train longer with `diffattn train --preset small --attention diff_v1 --out DIR`.)\n";
}

}  // namespace diffattn::cli
