// The demo's retrieval section: DIFF V1, DIFF V2 and a standard model of equal size trained on
// the same multi-needle retrieval batches (the defaults of `diffattn experiment retrieval`,
// with fewer held-out samples), their tables, and the report with its plots and heatmaps.
#include <algorithm>
#include <chrono>
#include <iostream>

#include "cli/demo.h"
#include "cli/table.h"
#include "diffattn/eval/experiment.h"
#include "diffattn/kernels/runtime.h"

namespace diffattn::cli {

void demo_retrieval(std::ostream& os, int section, const std::string& out_dir, int64_t steps) {
  eval::RetrievalExperimentOptions o;  // the task's defaults: context 32..64, 4 needles, 2 queried
  o.task.min_context = 32;
  o.lengths = {32, 48, 64, 96};
  o.eval_samples = 128;
  o.noise_samples = 32;
  o.size.max_seq_len = 0;
  o.train.steps = steps;
  o.progress = true;  // a bar on stderr while each model trains (when it is a terminal)
  o.train.batch = 16;
  o.train.adamw.lr = 3e-3;
  o.train.adamw.min_lr = 3e-4;
  o.train.adamw.warmup = std::min<int64_t>(30, steps / 2);
  o.train.adamw.weight_decay = 0.0;
  o.out_dir = out_dir;

  const data::RetrievalSample sample = data::make_retrieval_sample(o.task, 0);
  os << "\n== " << section << ". Multi-needle retrieval: DIFF V1, DIFF V2 and standard attention ==\n\n"
     << "After the paper's key-information retrieval (arXiv:2410.05258 section 3.4), small: contexts of\n"
        "32..64 letters hold 4 needles \"#KEYv\"; 2 keys are asked for at the end (\"?KEY\" -> v); the\n"
        "other 2 needles are near misses (a queried key with one letter changed, another value). Loss\n"
        "on the answers only. Three models of ~133k parameters (2 layers, d_model 64), the same seed and\n"
        "batches, "
     << o.train.steps << " steps of " << o.train.batch << " contexts each, " << kernels::num_threads()
     << " thread(s). A training sample:\n  " << sample.text() << "\n\n";
  const auto t0 = std::chrono::steady_clock::now();
  eval::RetrievalExperimentResult r = eval::run_retrieval_experiment(o, [&](const std::string& s) { os << s << std::endl; });
  os << "\n";
  eval::print_retrieval_tables(os, r);
  const std::vector<std::string> files = eval::write_retrieval_report(r, out_dir);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  os << "\n(" << fixed(secs, 0) << " s in all.)\nThe report, its plots and heatmaps: " << out_dir << "/report.md";
  for (const std::string& f : files) {
    if (f.size() > 4 && f.compare(f.size() - 4, 4, ".png") == 0) os << "\n  " << f;
  }
  os << "\nThe models: " << out_dir << "/models/{diff_v1,diff_v2,standard}; look inside with\n"
     << "  diffattn maps --model " << out_dir << "/models/diff_v1 --prompt '" << sample.text().substr(0, 40)
     << "' --layer 1 --head 0\n"
     << "  diffattn analyze --model " << out_dir << "/models/diff_v2\n"
     << "  diffattn explore --model " << out_dir << "/models/diff_v1," << out_dir << "/models/diff_v2," << out_dir
     << "/models/standard\n"
     << "Scale it up with `diffattn experiment retrieval --steps 6000 --context 128 --lengths 64,128,192`.\n";
}

}  // namespace diffattn::cli
