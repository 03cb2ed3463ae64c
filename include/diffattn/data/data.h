// Data for the language model (docs/DESIGN.md, layer `data`): tokenizers (byte-level by
// default, SentencePiece when a model directory holds tokenizer.model), the King James Bible
// corpus from Debian's bible-kjv package, and datasets as an interface (so synthetic tasks plug
// in). Training and generation are the layer above (train.h).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "diffattn/model/model.h"
#include "diffattn/model/model_dir.h"
#include "diffattn/model/train_context.h"

namespace diffattn::data {

class HfTokenizer;  // hf_tokenizer.h

// ---- tokenizers ----

// Decodes ids one at a time for streamed output: push(id) returns the text that became final,
// whole UTF-8 characters only (a character split across tokens waits for its last byte);
// finish() returns what is left (bytes that never completed a character, as U+FFFD). The
// pieces put together are decode(ids) of the ids pushed (for valid UTF-8).
class TextStream {
 public:
  virtual ~TextStream() = default;
  virtual std::string push(int32_t id) = 0;
  virtual std::string finish() = 0;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // add_special: the tokenizer's own special tokens around the text (tokenizer.json's
  // post-processor template, e.g. Llama 3's <|begin_of_text|>); false leaves them out, as a
  // prompt whose template already wrote them needs. The byte and SentencePiece tokenizers add
  // none either way (SentencePiece models here are trained without bos/eos).
  virtual std::vector<int32_t> encode(const std::string& text, bool add_special) const = 0;
  std::vector<int32_t> encode(const std::string& text) const { return encode(text, true); }
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  // A stream over this tokenizer (its lifetime within the tokenizer's): the byte and
  // tokenizer.json tokenizers decode each id on its own (O(1) a token); SentencePiece, whose
  // pieces may join, decodes what is new against the ids so far.
  virtual std::unique_ptr<TextStream> stream() const;
  virtual int64_t vocab_size() const = 0;
  virtual std::string name() const = 0;
  // The end-of-sequence id generation stops at (-1: none).
  virtual int32_t eos_id() const { return -1; }
  // Whether decode() gives id a text: an id below vocab_size() that is not a hole.
  virtual bool is_token(int32_t id) const { return id >= 0 && id < vocab_size(); }
  // The bytes token `id` adds to a decoded text, for constrained output's token masks
  // (diffattn/grammar/token_mask.h); "" when the id is not text: a special or control token,
  // an unknown or unused piece, a hole in the ids. SentencePiece's U+2581 is a space here (its
  // decoder drops the space that starts a text). An id outside 0..vocab_size()-1 is an error.
  virtual std::string token_bytes(int32_t id) const = 0;
  // The Hugging Face tokenizer.json behind this one, or null (its own API: token strings,
  // bos/eos ids).
  virtual const HfTokenizer* hf() const { return nullptr; }
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
// A Hugging Face tokenizer.json (and tokenizer_config.json beside it): encode adds the
// template's special tokens (Llama 3's <|begin_of_text|>).
std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path);
// Which tokenizer a command uses for a model directory: the directory's own, or raw bytes as
// token ids (`--tokenizer bytes`: asked for, never assumed, for a directory that brings none).
enum class TokenizerChoice { kModel, kBytes };
TokenizerChoice parse_tokenizer_choice(const std::string& name, const std::string& where);
// kModel: DIR/tokenizer.json if present, else DIR/tokenizer.model, else the byte tokenizer for
// diffattn's own format (a model without tokenizer.model is byte-level: FORMAT.md), and for a
// Hugging Face directory an IoError naming what is missing (transformers' AutoTokenizer refuses
// such a directory too; its ids are not bytes). kBytes: the byte tokenizer.
std::unique_ptr<Tokenizer> tokenizer_for(const std::string& model_dir,
                                         TokenizerChoice choice = TokenizerChoice::kModel);
// The same for a resolved directory: its tokenizer file and the tokenizer_config.json text it
// already read (nothing of the directory is read twice).
std::unique_ptr<Tokenizer> tokenizer_for(const model::ModelDir& dir,
                                         TokenizerChoice choice = TokenizerChoice::kModel);

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
// max_batches batches of (B, T), each window scored on all T targets, through run (its
// activations are overwritten: a trainer passes its own, so evaluation takes no second set).
double eval_loss(model::TrainContext& run, const std::vector<int32_t>& tokens, int64_t B, int64_t T,
                 int64_t max_batches);

}  // namespace diffattn::data
