// The retrieval experiment behind `diffattn experiment retrieval` and the demo's last section:
// DIFF V1, DIFF V2 and a standard Transformer of (nearly) equal parameters trained on the same
// multi-needle retrieval task (retrieval.h) with the same seed, the same batches in the same
// order and the same token budget; then accuracy by context length and by needle depth on
// held-out samples, the attention-noise analysis (inspect.h), and a report (Markdown and PNG).
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

#include "diffattn/data/retrieval.h"
#include "diffattn/eval/inspect.h"
#include "diffattn/train/train.h"

namespace diffattn::eval {

// The model of kind `kind` of a standard size (its d_model, n_layers, n_heads, ffn_dim and
// max_seq_len, as the presets describe sizes): DIFF V1 pairs its heads (n_heads / 2 pairs of
// head_dim, values 2 * head_dim wide), DIFF V2 keeps n_heads output heads and doubles the query
// heads, and pays for them with a smaller SwiGLU (model_of_size's rule), so the three have
// (nearly) equal parameter counts.
model::ModelConfig version_of_size(const model::ModelConfig& standard, nn::AttnKind kind, int64_t vocab_size = 256);

struct RetrievalExperimentOptions {
  data::RetrievalSpec task;           // the training task; task.seed also seeds the weights
  std::vector<int64_t> lengths;       // contexts to evaluate (each <= max_seq_len - queries)
  std::vector<double> depths = {0.0, 0.25, 0.5, 0.75, 1.0};
  int64_t depth_context = 0;          // context of the depth evaluation; 0: task.context
  int64_t eval_samples = 256;         // held-out samples per length and per depth
  int64_t noise_samples = 64;         // held-out samples for the attention-noise analysis
  model::ModelConfig size = model::model_preset("tiny", nn::AttnKind::Standard);  // the standard model's size
  double init_std = 0.02;             // std of the initial projection weights
  train::TrainOptions train;           // steps, batch, lr, ...; seq_len is set from the task
  std::vector<nn::AttnKind> kinds = {nn::AttnKind::DiffV1, nn::AttnKind::DiffV2,
                                     nn::AttnKind::Standard};
  std::string out_dir;                // models/<kind>/ and the report go here ("" : nothing saved)
  // Initialise with paired_init (lm_experiment.h: every tensor of the same name and shape
  // byte-identical across the kinds, init_std applied) instead of init_weights + rescaling.
  bool paired_init = false;
  bool progress = false;              // a progress bar on stderr while a model trains, when
                                      // stderr is a terminal (Trainer::progress; needs out_dir)
};

// Held-out samples: the same task drawn from another seed (the training seed + 1,000,000,007).
data::RetrievalSpec heldout(const data::RetrievalSpec& task);

struct RetrievalModelResult {
  nn::AttnKind kind = nn::AttnKind::Standard;
  std::string dir;                    // the saved model directory ("" if not saved)
  int64_t params = 0;
  double seconds = 0;                 // training wall time
  std::vector<double> loss_curve;     // training loss per step
  std::vector<double> lambdas;        // per layer after training (DIFF; V2: mean over answer rows)
  std::vector<double> acc_by_length;  // same order as options.lengths
  std::vector<double> acc_by_depth;   // same order as options.depths
  NoiseAnalysis noise;
};

struct RetrievalExperimentResult {
  RetrievalExperimentOptions options;
  std::vector<RetrievalModelResult> models;
  std::vector<std::string> files;     // report and pictures written
};

// Accuracy (argmax of the answer position's logits == the value) over `samples` samples of
// `spec` with context C (or all queries' needles with spec.depth as given); only_first: score
// query 0 only (the one spec.depth places). The forwards run through `run`.
double retrieval_accuracy(model::TrainContext& run, const data::RetrievalSpec& spec, int64_t samples,
                          bool only_first = false, int64_t batch = 32);

// Trains and evaluates every kind; `log` receives progress lines (may be empty).
RetrievalExperimentResult run_retrieval_experiment(
    const RetrievalExperimentOptions& o, const std::function<void(const std::string&)>& log = {});

// The tables as text (accuracy by length, by depth, attention noise, lambda).
void print_retrieval_tables(std::ostream& os, const RetrievalExperimentResult& r);

// Writes report.md, accuracy_by_length.png, accuracy_by_depth.png, training_loss.png,
// query_row.png/.npy (one held-out query's answer row in every layer and head of every model)
// and noise.png into dir; returns the paths.
std::vector<std::string> write_retrieval_report(RetrievalExperimentResult& r, const std::string& dir);

// The same experiment over several seeds (each result one seed's run, same options but the
// seed): summary.md and summary.json in dir: per kind and context length the accuracy of every
// seed with its 95% Wilson interval over that seed's held-out queries, the mean over seeds with
// a 95% Student-t interval over seeds, against chance (1 / needles) and the elimination
// baseline; per pair of kinds (against standard, and V1 - V2) the paired difference per seed
// and its t-interval over seeds. Returns the paths.
std::vector<std::string> write_retrieval_seed_summary(const std::vector<RetrievalExperimentResult>& runs,
                                                      const std::string& dir);
// 95% Wilson score interval of k successes in n trials: {lo, hi}.
std::pair<double, double> wilson_interval(double k, double n);

}  // namespace diffattn::eval
