// Training and text generation (docs/DESIGN.md, layer `train`, src/train): the training loop
// with its resumable checkpoints, the bounds on a run's options, and KV-cache generation.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "diffattn/data/data.h"
#include "diffattn/model/checkpoint.h"
#include "diffattn/model/config.h"
#include "diffattn/model/model.h"
#include "diffattn/model/optimizer.h"
#include "diffattn/model/safetensors.h"
#include "diffattn/model/train_context.h"
#include "diffattn/infer/generate.h"
#include "diffattn/infer/sampler.h"

namespace diffattn::train {

// The data and infer rooms' types this room's API takes.
using data::Dataset;
using data::Tokenizer;
using infer::GenerateOptions;
using infer::SamplerOptions;

// ---- generation (the loop itself: infer/generate.h) ----
// The ids a model directory's generation ends at: generation_config.json's eos_token_id (a
// number or a list) when the file exists, else the tokenizer's end-of-sequence id, else none.
// An eos_token_id the model cannot produce (not below model_vocab) is an IoError naming the file
// and the id.
std::vector<int32_t> stop_ids_for(const std::string& model_dir, const Tokenizer& tok,
                                  int64_t model_vocab);
// The same from a resolved directory's generation_config.json text (read once by open_model_dir).
std::vector<int32_t> stop_ids_for(const model::ModelDir& dir, const Tokenizer& tok, int64_t model_vocab);
// Restricts sampling to the ids that both the model (below model_vocab) and the tokenizer (its
// tokens, holes left out) have: a padded embedding's extra rows are never drawn, so generated
// text always decodes. InvalidArgument when no id is left.
void restrict_to_tokens(SamplerOptions& o, const Tokenizer& tok, int64_t model_vocab);

// Prefills the prompt through the KV cache, then decodes one token at a time, passing each new
// piece of text to on_text as soon as it is known (streamed output): whole UTF-8 characters, an
// invalid or unfinished byte sequence as U+FFFD (base/text.h, Utf8Stream). Returns the new
// text, valid UTF-8 the same way. Only ids the tokenizer has are drawn (restrict_to_tokens).
std::string generate(const model::Model& m, const Tokenizer& tok, const std::string& prompt,
                     const GenerateOptions& o,
                     const std::function<void(const std::string&)>& on_text = {});

// ---- training ----
struct TrainOptions {
  int64_t steps = 100;
  int64_t batch = 8;      // sequences per micro-batch
  int64_t seq_len = 128;  // T
  int64_t accum = 1;      // micro-batches per optimizer step
  model::AdamWOptions adamw;
  uint64_t seed = 1;
  int64_t eval_every = 0;  // 0: never
  int64_t eval_batches = 8;
  int64_t save_every = 0;  // 0: only at the end
  std::string corpus = "kjv";       // load_corpus spec, so a resumed run rebuilds the same data
  std::string tokenizer = "bytes";  // "bytes" or "sentencepiece" (DIR/tokenizer.model)
  std::string to_json() const;
  static TrainOptions from_json(const std::string& text, const std::string& where);
};

// Throws InvalidArgument naming the option (the JSON key) when a count is out of range, a rate
// is negative, B * T * accum overflows, or one micro-batch's activations (train_step_bytes, an
// estimate) exceed this machine's physical memory. The Trainer calls it before allocating.
void check_train_options(const TrainOptions& o, const model::ModelConfig& cfg);
// Bytes of activations and gradients one forward + backward of (batch, seq_len) keeps, about;
// throws InvalidArgument when the product overflows.
int64_t train_step_bytes(const model::ModelConfig& cfg, int64_t batch, int64_t seq_len);

// What a resume point (DIR/train_state.safetensors, docs/FORMAT.md) says besides its tensors.
struct TrainState {
  model::ModelConfig config;
  TrainOptions options;  // checked by check_train_options against config
  int64_t step = 0;      // optimizer steps taken, 0 to options.steps
  int64_t adamw_t = 0;   // AdamW updates taken, 0 to step
};
// Parses and checks a resume point's metadata field by field; errors are IoError naming `where`
// (the file) and the field.
TrainState parse_train_state(const std::map<std::string, std::string>& metadata,
                             const std::string& where);
// Every check of a resume point that needs only its header: the metadata, and the weights and
// both AdamW moments of every tensor present with the shapes the config implies. Allocates
// nothing sized by the file.
TrainState check_train_state_header(const model::SafeTensorsHeader& h, const std::string& where);

struct StepLog {
  int64_t step = 0;  // 1-based count of optimizer steps taken
  double loss = 0, grad_norm = 0, lr = 0, tokens_per_s = 0;
  double val_loss = -1;  // < 0: not evaluated at this step
  std::vector<double> lambdas;
  std::string to_json() const;
};

// One run of training in a directory: DIR/config.json + model.safetensors (the model),
// DIR/train_state.safetensors (weights, AdamW moments, step, options: the resume point, one
// atomic file), DIR/train_log.jsonl (one StepLog a line).
class Trainer {
 public:
  // A new run: model initialised from opts.seed.
  Trainer(const std::string& dir, const model::ModelConfig& cfg, const TrainOptions& opts);
  // A new run from given weights (fine-tuning, or a run started from a saved model).
  Trainer(const std::string& dir, model::Model model, const TrainOptions& opts);
  // Resumes DIR from its train_state.safetensors; the log is cut back to the saved step.
  static Trainer resume(const std::string& dir);

  // Runs until `opts.steps` steps are done (or `until` if > 0 and smaller); each step is passed
  // to on_step. Saves every save_every steps and at the end.
  void run(const Dataset& train, const std::vector<int32_t>* valid, int64_t until = 0,
           const std::function<void(const StepLog&)>& on_step = {});
  // One optimizer step (accum micro-batches); returns its log (no eval, no save).
  StepLog step(const Dataset& train);
  // Writes the checkpoint files in the order checkpoint_files() gives: the resume point, one
  // atomic file, then the model (config.json, model.safetensors and model_files) through
  // save_model, which replaces the directory's model as one. A kill at any moment leaves either
  // no resume point (as before the first save: the run starts again without --resume) or a
  // whole one, and the directory's model old or new, whole.
  void save() const;
  static const std::vector<std::string>& checkpoint_files();
  // Changes how long the run goes and how often it evaluates and saves (what `train --resume`
  // may change): checked like the constructor's options. A new `steps` also moves the end of
  // the cosine decay, so the learning rate from the current step on follows the new schedule.
  void set_schedule(int64_t steps, int64_t eval_every, int64_t eval_batches, int64_t save_every);

  model::Model& model() { return *model_; }
  // The run state of the last step or evaluation (activations, gradients: lambdas, looking
  // inside); eval_loss runs through it (no second set of activations).
  model::TrainContext& context() { return ctx_; }
  const TrainOptions& options() const { return opts_; }
  int64_t steps_done() const { return step_; }
  const std::string& dir() const { return dir_; }
  bool progress = false;  // progress bar on stderr
  bool write_log = true;
  // Saved with the model (its tokenizer.model; replace_tokenizer so that a tokenizer the
  // directory held before is not left beside it).
  model::ModelFiles model_files;

 private:
  std::string dir_;
  std::unique_ptr<model::Model> model_;  // on the heap: ctx_ points at it, and a Trainer moves
  model::TrainContext ctx_;
  TrainOptions opts_;
  model::AdamW adam_;
  int64_t step_ = 0;
  std::vector<int32_t> tok_, tgt_;
};

}  // namespace diffattn::train
