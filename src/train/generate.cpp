// Text generation: one inference session over a contiguous KV store of one sequence; the
// prompt goes through it in one batch (a prefill), then each new token in a batch of one row
// (Tq = 1 against the cache). Text is streamed as it becomes known.
#include <sys/stat.h>

#include <algorithm>
#include <climits>
#include <nlohmann/json.hpp>
#include <string>

#include "diffattn/base/json_util.h"

#include "diffattn/base/files.h"
#include "diffattn/base/text.h"
#include "diffattn/infer/session.h"
#include "diffattn/train/train.h"

namespace diffattn::train {

void restrict_to_tokens(SamplerOptions& o, const Tokenizer& tok, int64_t model_vocab) {
  const int64_t n = std::min<int64_t>(model_vocab, tok.vocab_size());
  o.vocab_limit = n;
  o.excluded.clear();
  for (int64_t id = 0; id < n; ++id) {
    if (!tok.is_token(static_cast<int32_t>(id))) o.excluded.push_back(static_cast<int32_t>(id));
  }
  if (n <= 0 || static_cast<int64_t>(o.excluded.size()) == n) {
    throw InvalidArgument("generate: none of the model's " + std::to_string(model_vocab) +
                          " ids is a token of the " + tok.name() + " tokenizer (" +
                          std::to_string(tok.vocab_size()) + " ids): nothing could be decoded");
  }
}

namespace {

// stop_ids_for over generation_config.json's text (nullopt: no such file); p names it.
std::vector<int32_t> stop_ids_from(const std::optional<std::string>& text, const std::string& p,
                                   const Tokenizer& tok, int64_t model_vocab) {
  std::vector<int32_t> ids;
  if (text) {
    const nlohmann::json j = parse_json_object(*text, p);
    if (j.contains("eos_token_id") && !j.at("eos_token_id").is_null()) {
      const nlohmann::json& e = j.at("eos_token_id");
      const nlohmann::json list = e.is_array() ? e : nlohmann::json::array({e});
      for (const nlohmann::json& x : list) {
        if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > INT32_MAX) {
          throw IoError(p + ": eos_token_id must be a token id or a list of them, got " +
                        json_brief(e));
        }
        const int64_t id = x.get<int64_t>();
        // An id past the model's vocabulary can never be generated: the file belongs to
        // another model.
        if (id >= model_vocab) {
          throw IoError(p + ": eos_token_id " + std::to_string(id) + " is not an id of the model (its vocabulary has " +
                        std::to_string(model_vocab) + " ids: 0.." + std::to_string(model_vocab - 1) + ")");
        }
        ids.push_back(static_cast<int32_t>(id));
      }
      return ids;
    }
  }
  if (tok.eos_id() >= 0) ids.push_back(tok.eos_id());
  return ids;
}

}  // namespace

std::vector<int32_t> stop_ids_for(const std::string& model_dir, const Tokenizer& tok,
                                  int64_t model_vocab) {
  const std::string p = model_dir + "/generation_config.json";
  struct stat st {};
  std::optional<std::string> text;
  if (::stat(p.c_str(), &st) == 0) text = read_file(p, kMaxJsonFileBytes);
  return stop_ids_from(text, p, tok, model_vocab);
}

std::vector<int32_t> stop_ids_for(const model::ModelDir& dir, const Tokenizer& tok, int64_t model_vocab) {
  return stop_ids_from(dir.generation_config, dir.file("generation_config.json"), tok, model_vocab);
}

std::string generate(const model::Model& m, const Tokenizer& tok, const std::string& prompt,
                     const GenerateOptions& o,
                     const std::function<void(const std::string&)>& on_text) {
  if (o.max_new < 0) {
    throw InvalidArgument("generate: max_new must be >= 0, got " + std::to_string(o.max_new));
  }
  GenerateOptions restricted = o;
  restrict_to_tokens(restricted.sampler, tok, m.config().vocab_size);
  // An empty prompt starts from a newline (the KJV corpus is one verse a line). A prompt that
  // encodes to no tokens at all (SentencePiece drops whitespace, newlines included) leaves the
  // model nothing to continue: the trained models have no BOS token to start from.
  std::vector<int32_t> ids = tok.encode(prompt.empty() ? std::string("\n") : prompt);
  if (ids.empty()) {
    throw InvalidArgument("generate: the prompt encodes to no tokens with the " + tok.name() +
                          " tokenizer (it is empty or only whitespace); give some text to continue");
  }
  // A byte-level token or a BPE token may hold part of a character: what is passed on is whole
  // characters, invalid bytes as U+FFFD (valid UTF-8 text is unchanged), through the
  // tokenizer's stream (no re-decoding of the answer per token); the text returned is the
  // pieces put together.
  const std::unique_ptr<data::TextStream> stream = tok.stream();
  std::string text;
  auto emit = [&](const std::string& piece) {
    text += piece;
    if (on_text && !piece.empty()) on_text(piece);
  };
  infer::generate_ids(m, ids, restricted, [&](int32_t next) {
    emit(stream->push(next));
    return true;
  });
  emit(stream->finish());
  return text;
}

}  // namespace diffattn::train
