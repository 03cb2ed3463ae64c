// Hugging Face `tokenizer.json` (the `tokenizers` library's file) for byte-level BPE models:
// GPT-2, Llama 3 and the many models that copy their layout. Encoding reproduces the library's
// ids (tests: the vectors in ../shared/data/tokenizers, when present beside the repository).
//
// Supported, checked when the file is read (anything else is an error naming the field):
//   model            BPE (type "BPE", or no type with vocab and merges: the old format), merges
//                    as "a b" strings or [a, b] pairs, ignore_merges, no dropout, no byte_fallback
//   normalizer       null
//   pre_tokenizer    ByteLevel (GPT-2's regex unless use_regex is false), Split with a Regex or
//                    String pattern and behavior "Isolated", and Sequences of those
//   post_processor   ByteLevel, TemplateProcessing (special tokens around the sequence, e.g.
//                    Llama 3's BOS), and Sequences of those; null
//   decoder          ByteLevel
//   added_tokens     matched in the text before pre-tokenization, longest first
//
// Ids are the library's or the file is refused, naming the entry: an added token must have the
// id the library gives it (a vocab token's own id, else the next past the vocab and the added
// tokens before it), one id has one string, no key is given twice, every merge's parts and
// result are in the vocab (the library refuses a merge into a missing token; GPT-2's file has
// one); a pair merged twice takes its last rank.
//
// Limits: the file at most 256 MiB (read_file), a vocabulary of at most 2^24 tokens, token
// strings and texts are UTF-8 (invalid UTF-8 is an error naming the byte offset).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace diffattn::data {

// GPT-2's bytes_to_unicode: the character (UTF-8) that stands for byte b (0..255) in the token
// strings of byte-level vocabularies: printable bytes themselves, the others U+0100 on in order.
std::string hf_byte_char(int b);

class HfTokenizer {
 public:
  // Parses the text of a tokenizer.json; `where` (the path) starts every error (IoError).
  static HfTokenizer from_json(const std::string& text, const std::string& where);
  // Reads a tokenizer.json file, or a directory holding one and, when present, its
  // tokenizer_config.json: bos_token and eos_token (a string or {"content": ...}), and
  // add_bos_token / add_eos_token, which put those tokens around an encoded text (true) or keep
  // them out of the template (false). Other keys are ignored.
  static HfTokenizer load(const std::string& path);
  // Applies a tokenizer_config.json's text (the keys above); `where` names it in errors.
  void apply_config(const std::string& text, const std::string& where);

  HfTokenizer(HfTokenizer&&) noexcept;
  HfTokenizer& operator=(HfTokenizer&&) noexcept;
  ~HfTokenizer();

  // Token ids of a UTF-8 text; add_special_tokens applies the post-processor's template
  // (Llama 3: <|begin_of_text|> in front; GPT-2: nothing).
  std::vector<int32_t> encode(const std::string& text, bool add_special_tokens = false) const;
  // The text of ids (byte-level decoding; added tokens as their content unless skip_special).
  // An id outside the vocabulary is an error.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const;

  // Number of ids: max id + 1 over the model's vocabulary and the added tokens.
  int64_t vocab_size() const;
  // The token string of an id (byte-level form, e.g. "Ġhello"), "" for a hole in the ids.
  const std::string& token(int32_t id) const;
  // The id of a token string (vocabulary or added token); -1 if none.
  int32_t id_of(const std::string& token) const;
  bool is_special(int32_t id) const;
  // The tokenizer_config.json's bos_token / eos_token ids; -1 when not given.
  int32_t bos_id() const;
  int32_t eos_id() const;

 private:
  struct Impl;
  explicit HfTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Decodes ids one at a time for streaming output: push() returns the text that is complete so
// far, whole UTF-8 characters only (a character split across tokens waits for its last byte);
// finish() returns what is left (bytes that never completed a character, replaced by U+FFFD).
class TokenStreamer {
 public:
  explicit TokenStreamer(const HfTokenizer& tok, bool skip_special = false)
      : tok_(tok), skip_special_(skip_special) {}
  std::string push(int32_t id);
  std::string finish();

 private:
  const HfTokenizer& tok_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace diffattn::data
