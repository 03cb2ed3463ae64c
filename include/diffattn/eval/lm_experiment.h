// The paired language-model experiment behind `diffattn experiment lm` (the CPU-scale twin of
// bench/gpu_experiment.py): DIFF V1, DIFF V2 and a standard Transformer of (nearly) equal size
// per seed, initialised in pairs (every tensor of the same name and shape byte-identical across
// the three), trained on the same windows of the same corpus in the same order; evaluated on the
// corpus's held-out documents: loss per document, the paired difference per document with a 95%
// Student-t interval over documents, the same by position bucket, lambda per layer; a report
// (Markdown, JSON and two PNG charts).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "diffattn/model/model.h"
#include "diffattn/train/train.h"

namespace diffattn::eval {

// The corpus scripts/corpus.py writes (docs/corpus.md), as byte tokens: the training documents
// joined by a blank line, the held-out documents one by one.
struct LmDocument {
  std::string id;  // source/id
  std::vector<int32_t> tokens;
};
struct LmCorpus {
  std::vector<int32_t> train;
  int64_t train_documents = 0;
  std::vector<LmDocument> heldout;
};
// Reads DIR/train.jsonl and DIR/heldout.jsonl (one {"source", "id", "text"} a line; at most
// max_docs documents of each when > 0). IoError naming the file (and line) when a file is
// missing, a line is not such a record, or a split is empty.
LmCorpus read_lm_corpus(const std::string& dir, int64_t max_docs = 0);

// Draws every tensor from its own generator seeded by (seed, name, shape): norm scales 1, V1's
// lambda vectors N(0, 0.1), the rest N(0, init_std). Tensors of the same name and shape get the
// same bytes in any architecture.
void paired_init(model::Model& m, uint64_t seed, double init_std = 0.02);
// How many tensors (same name and shape) at least two of the models share; throws
// InvalidArgument naming the tensor when a shared one differs in any byte.
int64_t check_pairing(const std::vector<const model::Model*>& models);

struct Interval {
  int64_t n = 0;
  double mean = 0, lo = 0, hi = 0;  // lo = hi = NaN when n < 2
};
// The 0.975 quantile of Student's t with df degrees of freedom (table to 30, then a
// Cornish-Fisher expansion around the normal's 1.96).
double t975(int64_t df);
// Mean and 95% Student-t interval of x.
Interval t_interval(const std::vector<double>& x);
// Position buckets [lo, hi) over 0..T-1: [0,8) [8,64) then powers of 4 from 64, the last to T.
std::vector<std::pair<int64_t, int64_t>> position_buckets(int64_t T);

struct LmExperimentOptions {
  std::string corpus_dir;
  int64_t max_docs = 0;               // per split; 0: all
  std::vector<uint64_t> seeds = {1, 2, 3};
  model::ModelConfig size;                   // the standard model's d_model, n_layers, n_heads, ffn_dim
  double init_std = 0.02;
  train::TrainOptions train;           // steps, batch, seq_len, adamw; seed set per seed
  int64_t eval_windows = 4;           // windows of seq_len per held-out document
  std::vector<nn::AttnKind> kinds = {nn::AttnKind::DiffV1, nn::AttnKind::DiffV2,
                                     nn::AttnKind::Standard};
};

struct LmModelResult {
  nn::AttnKind kind = nn::AttnKind::Standard;
  int64_t params = 0;
  double seconds = 0;
  std::vector<double> loss_curve;
  std::vector<double> doc_loss;                  // per held-out document, nats per byte
  std::vector<std::vector<double>> bucket_loss;  // [document][bucket]
  std::vector<double> lambdas;                   // per layer (V2: mean over the tokens read)
  double loss_doc_mean = 0;
};
struct LmSeedResult {
  uint64_t seed = 0;
  std::vector<LmModelResult> models;  // in options.kinds order
};
struct LmPaired {
  nn::AttnKind a, b;
  std::vector<Interval> per_seed;  // per-document differences a - b, per seed
  Interval pooled;                 // each document's difference averaged over the seeds
  Interval across_seeds;           // over the seeds' mean differences
  std::vector<Interval> by_bucket; // pooled, per position bucket
};
struct LmExperimentResult {
  LmExperimentOptions options;
  int64_t train_tokens = 0, train_documents = 0, heldout_tokens_scored = 0;
  std::vector<std::string> heldout_ids;
  std::vector<std::pair<int64_t, int64_t>> buckets;
  int64_t shared_tensors = 0;
  std::vector<LmSeedResult> seeds;
  std::vector<LmPaired> paired;
  double seconds = 0;
};

LmExperimentResult run_lm_experiment(const LmExperimentOptions& o,
                                     const std::function<void(const std::string&)>& log = {});
// report.md, report.json, loss_by_position.png and training_loss.png into dir; returns the paths.
std::vector<std::string> write_lm_report(const LmExperimentResult& r, const std::string& dir);

}  // namespace diffattn::eval
