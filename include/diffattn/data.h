// Data for the language model (docs/DESIGN.md, layer `data`): tokenizers (byte-level by
// default, SentencePiece when a model directory holds tokenizer.model), the King James Bible
// corpus from Debian's bible-kjv package, datasets as an interface (so synthetic tasks plug in),
// and the training loop with its resumable checkpoints.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "diffattn/model.h"

namespace diffattn::data {

// ---- tokenizers ----
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int32_t> encode(const std::string& text) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual std::string name() const = 0;
};

// Bytes 0..255 are the tokens.
std::unique_ptr<Tokenizer> byte_tokenizer();
// A SentencePiece model file (Debian's libsentencepiece), at most kMaxTokenizerFileBytes.
inline constexpr uint64_t kMaxTokenizerFileBytes = uint64_t{256} << 20;  // 256 MiB
std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& path);
// The same from the file's bytes in memory (name: what messages call it).
std::unique_ptr<Tokenizer> parse_sentencepiece(const std::string& bytes, const std::string& name);
// Trains a SentencePiece unigram model of vocab_size pieces on text; writes it atomically to
// out_path. Seeded and single-threaded, so the same text gives the same model.
void train_sentencepiece(const std::string& text, const std::string& out_path, int64_t vocab_size,
                         uint32_t seed);
// DIR/tokenizer.model if present, else bytes.
std::unique_ptr<Tokenizer> tokenizer_for(const std::string& model_dir);

// ---- corpus ----
struct Corpus {
  std::string name;
  std::string train, valid;
};

// The King James Bible (public domain) from Debian's bible-kjv package: `bible -f
// gen1:1-rev22:21` with the verse references stripped, one verse a line. Produced on first use
// and cached in cache_dir (written atomically); an error says how to install the package.
std::string kjv_text(const std::string& cache_dir);
// Deterministic split: every `every`-th line (the last of each group) goes to validation.
Corpus split_lines(const std::string& name, const std::string& text, int every = 20);
// "kjv" (the default corpus) or the path of any UTF-8 text file.
Corpus load_corpus(const std::string& spec, const std::string& cache_dir);
// Where kjv_text caches by default: $DIFFATTN_DATA_DIR, else the build's data directory.
std::string default_cache_dir();

// ---- datasets ----
// A source of (tokens, targets) batches. batch(index, ...) is a pure function of index, so the
// data position of a run is one number and a resumed run sees the same batches.
class Dataset {
 public:
  virtual ~Dataset() = default;
  // tokens, targets (B, T); a target < 0 is not scored.
  virtual void batch(uint64_t index, int64_t B, int64_t T, int32_t* tokens,
                     int32_t* targets) const = 0;
  virtual std::string describe() const = 0;
};

// Random windows of a token stream (training): window (index, b) starts at a position drawn
// from a counter-based hash of (seed, index, b); targets are the tokens shifted by one.
class TokenWindows : public Dataset {
 public:
  TokenWindows(std::vector<int32_t> tokens, uint64_t seed, std::string name);
  void batch(uint64_t index, int64_t B, int64_t T, int32_t* tokens,
             int32_t* targets) const override;
  std::string describe() const override;
  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
  const std::vector<int32_t>& tokens() const { return tokens_; }

 private:
  std::vector<int32_t> tokens_;
  uint64_t seed_;
  std::string name_;
};

// Mean loss over consecutive non-overlapping windows of a token stream (validation): up to
// max_batches batches of (B, T), each window scored on all T targets.
double eval_loss(Model& model, const std::vector<int32_t>& tokens, int64_t B, int64_t T,
                 int64_t max_batches);

// ---- generation ----
struct GenerateOptions {
  int64_t max_new = 200;  // new tokens; fewer if the model's max_seq_len is reached
  SamplerOptions sampler;
};

// Prefills the prompt through the KV cache, then decodes one token at a time, passing each new
// piece of text to on_text as soon as it is known (streamed output). Returns the new text.
std::string generate(Model& m, const Tokenizer& tok, const std::string& prompt,
                     const GenerateOptions& o,
                     const std::function<void(const std::string&)>& on_text = {});

// ---- training ----
struct TrainOptions {
  int64_t steps = 100;
  int64_t batch = 8;      // sequences per micro-batch
  int64_t seq_len = 128;  // T
  int64_t accum = 1;      // micro-batches per optimizer step
  AdamWOptions adamw;
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
void check_train_options(const TrainOptions& o, const ModelConfig& cfg);
// Bytes of activations and gradients one forward + backward of (batch, seq_len) keeps, about;
// throws InvalidArgument when the product overflows.
int64_t train_step_bytes(const ModelConfig& cfg, int64_t batch, int64_t seq_len);

// What a resume point (DIR/train_state.safetensors, docs/FORMAT.md) says besides its tensors.
struct TrainState {
  ModelConfig config;
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
TrainState check_train_state_header(const SafeTensorsHeader& h, const std::string& where);

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
  Trainer(const std::string& dir, const ModelConfig& cfg, const TrainOptions& opts);
  // A new run from given weights (fine-tuning, or a run started from a saved model).
  Trainer(const std::string& dir, Model model, const TrainOptions& opts);
  // Resumes DIR from its train_state.safetensors; the log is cut back to the saved step.
  static Trainer resume(const std::string& dir);

  // Runs until `opts.steps` steps are done (or `until` if > 0 and smaller); each step is passed
  // to on_step. Saves every save_every steps and at the end.
  void run(const Dataset& train, const std::vector<int32_t>* valid, int64_t until = 0,
           const std::function<void(const StepLog&)>& on_step = {});
  // One optimizer step (accum micro-batches); returns its log (no eval, no save).
  StepLog step(const Dataset& train);
  // Writes the checkpoint files in the order checkpoint_files() gives. Each is written
  // atomically and the resume point comes first, so a kill at any moment leaves either no
  // resume point (as before the first save: the run starts again without --resume) or a whole
  // one; the model files that follow are loadable once both are there.
  void save() const;
  static const std::vector<std::string>& checkpoint_files();
  // Changes how long the run goes and how often it evaluates and saves (what `train --resume`
  // may change): checked like the constructor's options. A new `steps` also moves the end of
  // the cosine decay, so the learning rate from the current step on follows the new schedule.
  void set_schedule(int64_t steps, int64_t eval_every, int64_t eval_batches, int64_t save_every);

  Model& model() { return model_; }
  const TrainOptions& options() const { return opts_; }
  int64_t steps_done() const { return step_; }
  const std::string& dir() const { return dir_; }
  bool progress = false;  // progress bar on stderr
  bool write_log = true;

 private:
  std::string dir_;
  Model model_;
  TrainOptions opts_;
  AdamW adam_;
  int64_t step_ = 0;
  std::vector<int32_t> tok_, tgt_;
};

}  // namespace diffattn::data
