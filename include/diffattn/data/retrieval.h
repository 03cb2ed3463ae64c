// Multi-needle key-information retrieval at small scale, after the paper's setup
// (arXiv:2410.05258 section 3.4, "Key Information Retrieval", multi-needle): a context of C
// tokens of distractor text holds N key-value "needles"; R of the keys are asked for at the end
// and the model must answer with the value stored under each. Some of the unqueried needles
// carry near-miss keys, one symbol away from a queried key, so a model that matches a key only
// roughly answers with the wrong value.
//
// Everything is text of single bytes, so any byte-level model reads it and prompts can be typed:
//   context   filler: lowercase letters; a needle: '#' key value, e.g. "#KD7"
//   queries   '?' key value, e.g. "?KD7", one after another right after the context
//   keys      key_len uppercase letters from the first key_symbols of A..Z
//   values    one digit from the first value_symbols of 0..9
// The answer to a query is predicted at its key's last symbol (the target of that position is the
// value; every other target is -1, so the loss is on answer tokens only). The format suits
// induction heads: the answer is the token that followed the same key earlier in the sequence.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "diffattn/data/data.h"

namespace diffattn::data {

struct RetrievalSpec {
  int64_t context = 64;      // C: tokens of context (filler and needles) before the queries
  int64_t min_context = 0;   // > 0: each sample's C is drawn from [min_context, context]
  int64_t needles = 4;       // N key-value needles in the context
  int64_t queries = 2;       // R of them asked for at the end (R <= N)
  int64_t near_misses = -1;  // unqueried needles whose key is a queried key with one symbol
                             //   changed; -1: all N - R of them
  int64_t key_len = 2;       // symbols per key
  int64_t key_symbols = 8;   // alphabet of keys: A.. (at most 26)
  int64_t value_symbols = 10;  // alphabet of values: 0.. (at most 10)
  int64_t filler_symbols = 26;  // alphabet of the filler: a.. (at most 26)
  double depth = -1;         // in [0, 1]: query 0's needle starts at round(depth * (C - L)),
                             //   L the needle's length; < 0: every needle placed at random
  uint64_t seed = 1;

  int64_t needle_len() const { return key_len + 2; }  // '#' key value
  int64_t query_len() const { return key_len + 2; }   // '?' key value
  // Tokens of a sample with context C: C + R * query_len().
  int64_t sample_len(int64_t C) const { return C + queries * query_len(); }
  // Throws InvalidArgument naming the field when the spec is inconsistent (a context too short
  // for its needles, more queries than needles, too few keys for distinct near misses, ...).
  void validate() const;
  std::string to_json() const;
  static RetrievalSpec from_json(const std::string& text, const std::string& where);
};

struct RetrievalQuery {
  int64_t needle = 0;        // index into RetrievalSample::needles
  int64_t answer_pos = 0;    // position whose next-token target is the answer (the key's end)
  int32_t answer = 0;        // the value's token
};

struct RetrievalNeedle {
  int64_t start = 0;         // position of its '#'; the needle spans [start, start + needle_len)
  std::string key;
  int32_t value = 0;
  bool queried = false;
  int64_t near_miss_of = -1;  // index of the queried needle whose key it nearly matches, or -1
  double depth = 0;          // start / (C - needle_len), in [0, 1]
};

struct RetrievalSample {
  int64_t context = 0;          // C
  std::vector<int32_t> tokens;  // (C + R * query_len)
  std::vector<int32_t> targets; // same length: the answer at each query's key end, -1 elsewhere
  std::vector<RetrievalNeedle> needles;  // in order of position
  std::vector<RetrievalQuery> queries;   // in order of asking
  std::string text() const;     // the tokens as text
};

// The sample numbered `index` of a spec's stream: a pure function of (spec, index).
RetrievalSample make_retrieval_sample(const RetrievalSpec& spec, uint64_t index);

// The task a model of `experiment retrieval` was trained on (DIR/retrieval.json), or nothing
// when the directory has none; a file that is there but wrong is an error naming it.
std::optional<RetrievalSpec> read_retrieval_spec(const std::string& model_dir);

// Samples first .. first + B - 1 as one batch, right-padded with kRetrievalPad to the longest
// (causal rows never see their padding): tokens is (B, T).
struct RetrievalBatch {
  std::vector<RetrievalSample> samples;
  std::vector<int32_t> tokens;
  int64_t B = 0, T = 0;
};
RetrievalBatch make_retrieval_batch(const RetrievalSpec& spec, uint64_t first, int64_t B);

// The task as a Dataset for the Trainer: row b of batch k is sample k * B + b; rows shorter than
// T are padded on the right with '.' and target -1 (causal attention never lets a sample see
// its padding, so a padded row computes exactly what the sample alone would).
class RetrievalTask : public Dataset {
 public:
  explicit RetrievalTask(RetrievalSpec spec);
  void batch(uint64_t index, int64_t B, int64_t T, int32_t* tokens,
             int32_t* targets) const override;
  std::string describe() const override;
  const RetrievalSpec& spec() const { return spec_; }
  // The longest row this task produces (T must be at least this).
  int64_t max_len() const { return spec_.sample_len(spec_.context); }

 private:
  RetrievalSpec spec_;
};

inline constexpr int32_t kRetrievalPad = '.';

}  // namespace diffattn::data
