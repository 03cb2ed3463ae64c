// Tokenizers: bytes (the default, vocabulary 256) and SentencePiece (Debian's
// libsentencepiece), trained here on the corpus and saved as DIR/tokenizer.model.
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>

#include "diffattn/base/files.h"
#include "diffattn/base/text.h"
#include "diffattn/data/data.h"
#include "diffattn/data/hf_tokenizer.h"
#include "diffattn/model/checkpoint.h"

namespace diffattn::data {

namespace {

void check_token_id(int32_t id, int64_t vocab_size, const char* name) {
  if (id < 0 || id >= vocab_size) {
    throw InvalidArgument(std::string(name) + " tokenizer: token id " + std::to_string(id) +
                          " is outside 0.." + std::to_string(vocab_size - 1));
  }
}

class ByteTokenizer : public Tokenizer {
 public:
  using Tokenizer::encode;
  std::vector<int32_t> encode(const std::string& text, bool) const override {
    std::vector<int32_t> ids(text.size());
    for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
    return ids;
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string s;
    s.reserve(ids.size());
    for (size_t n = 0; n < ids.size(); ++n) {
      // Not id & 0xff: id 260 of a padded vocabulary is no byte, and must not read as \x04.
      if (ids[n] < 0 || ids[n] > 255) {
        throw InvalidArgument("decode: ids[" + std::to_string(n) + "] = " + std::to_string(ids[n]) +
                              " is not a byte (the byte tokenizer's ids are 0..255)");
      }
      s.push_back(static_cast<char>(ids[n]));
    }
    return s;
  }
  int64_t vocab_size() const override { return 256; }
  std::string name() const override { return "bytes"; }
  std::string token_bytes(int32_t id) const override {
    check_token_id(id, 256, "bytes");
    return std::string(1, static_cast<char>(id));
  }
  std::unique_ptr<TextStream> stream() const override {
    struct Bytes : TextStream {
      const ByteTokenizer* tok;
      Utf8Stream utf8;
      explicit Bytes(const ByteTokenizer* t) : tok(t) {}
      std::string push(int32_t id) override { return utf8.push(tok->decode({id})); }
      std::string finish() override { return utf8.finish(); }
    };
    return std::make_unique<Bytes>(this);
  }
};

// The protobuf wire format (protobuf.dev/programming-guides/encoding), enough to walk a
// SentencePiece ModelProto: field 1 of the model is a repeated SentencePiece message whose
// field 1 is the piece text. libsentencepiece builds its tries with Darts, which throws (and so
// aborts a caller that does not expect it) on an empty piece, so pieces are checked first.
class WireReader {
 public:
  WireReader(const char* p, size_t n) : p_(p), end_(p + n), begin_(p) {}
  bool done() const { return p_ == end_; }
  size_t pos() const { return static_cast<size_t>(p_ - begin_); }
  // false on a malformed varint.
  bool varint(uint64_t& v) {
    v = 0;
    for (int shift = 0; shift < 64 && p_ < end_; shift += 7) {
      const auto b = static_cast<unsigned char>(*p_++);
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return true;
    }
    return false;
  }
  // One field: its number, and for a length-delimited one its bytes; false when malformed.
  bool field(uint64_t& number, const char*& data, size_t& len) {
    uint64_t key;
    if (!varint(key)) return false;
    number = key >> 3;
    data = nullptr;
    len = 0;
    switch (key & 7) {
      case 0: {
        uint64_t ignored;
        return varint(ignored);
      }
      case 1: return skip(8);
      case 5: return skip(4);
      case 2: {
        uint64_t n;
        if (!varint(n) || n > static_cast<uint64_t>(end_ - p_)) return false;
        data = p_;
        len = static_cast<size_t>(n);
        p_ += n;
        return true;
      }
      default: return false;  // groups (3, 4) and undefined types: not in a ModelProto
    }
  }

 private:
  bool skip(size_t n) {
    if (static_cast<size_t>(end_ - p_) < n) return false;
    p_ += n;
    return true;
  }
  const char* p_;
  const char* end_;
  const char* begin_;
};

// Throws IoError naming `name` when bytes is not a well-formed ModelProto or holds an empty piece.
void check_sentencepiece_pieces(const std::string& bytes, const std::string& name) {
  WireReader model(bytes.data(), bytes.size());
  int64_t index = 0;
  while (!model.done()) {
    const size_t at = model.pos();
    uint64_t number;
    const char* data;
    size_t len;
    if (!model.field(number, data, len)) {
      throw IoError(name + ": not a SentencePiece model (malformed protobuf at byte " +
                    std::to_string(at) + ")");
    }
    if (number != 1) continue;
    if (data == nullptr) throw IoError(name + ": not a SentencePiece model (piece " + std::to_string(index) + " is not a message)");
    WireReader piece(data, len);
    bool has_text = false;
    while (!piece.done()) {
      uint64_t n;
      const char* d;
      size_t l;
      if (!piece.field(n, d, l)) {
        throw IoError(name + ": not a SentencePiece model (piece " + std::to_string(index) +
                      " is malformed)");
      }
      if (n == 1) has_text = d != nullptr && l > 0;
    }
    if (!has_text) throw IoError(name + ": piece " + std::to_string(index) + " of the SentencePiece model is empty");
    ++index;
  }
}

class SentencePieceTokenizer : public Tokenizer {
 public:
  // bytes: a serialized SentencePiece ModelProto; name: the file it came from, for messages.
  SentencePieceTokenizer(const std::string& bytes, const std::string& name) : path_(name) {
    check_sentencepiece_pieces(bytes, name);
    sentencepiece::util::Status st;
    try {
      st = sp_.LoadFromSerializedProto(bytes);
    } catch (const std::exception& e) {
      // The library reports most problems as a status, but its trie builder throws.
      throw IoError(name + ": cannot load the SentencePiece model (" + e.what() + ")");
    }
    if (!st.ok()) throw IoError(name + ": cannot load the SentencePiece model (" + st.ToString() + ")");
    if (sp_.GetPieceSize() < 1) throw IoError(name + ": the SentencePiece model has no pieces");
  }
  using Tokenizer::encode;
  std::vector<int32_t> encode(const std::string& text, bool) const override {
    std::vector<int> ids;
    const auto st = sp_.Encode(text, &ids);
    if (!st.ok()) throw InvalidArgument("sentencepiece: cannot encode (" + st.ToString() + ")");
    return {ids.begin(), ids.end()};
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string s;
    const std::vector<int> v(ids.begin(), ids.end());
    const auto st = sp_.Decode(v, &s);
    if (!st.ok()) throw InvalidArgument("sentencepiece: cannot decode (" + st.ToString() + ")");
    return s;
  }
  int64_t vocab_size() const override { return sp_.GetPieceSize(); }
  std::string name() const override { return "sentencepiece"; }
  std::string token_bytes(int32_t id) const override {
    check_token_id(id, sp_.GetPieceSize(), "sentencepiece");
    if (sp_.IsControl(id) || sp_.IsUnknown(id) || sp_.IsUnused(id)) return "";
    const std::string piece = sp_.IdToPiece(id);
    if (sp_.IsByte(id)) {  // <0xAB>
      return piece.size() == 6 ? std::string(1, static_cast<char>(std::stoi(piece.substr(3, 2), nullptr, 16))) : "";
    }
    std::string out;
    static const std::string kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's word boundary
    for (size_t i = 0; i < piece.size();) {
      if (piece.compare(i, kSpace.size(), kSpace) == 0) {
        out += ' ';
        i += kSpace.size();
      } else {
        out += piece[i++];
      }
    }
    return out;
  }

 private:
  std::string path_;
  sentencepiece::SentencePieceProcessor sp_;
};

}  // namespace

std::unique_ptr<TextStream> Tokenizer::stream() const {
  // The ids so far decoded whole, what is new passed on through a UTF-8 stream (a piece may
  // change the text before it only where pieces join: then nothing is emitted for it).
  struct Redecode : TextStream {
    const Tokenizer* tok;
    std::vector<int32_t> ids;
    std::string raw;
    Utf8Stream utf8;
    explicit Redecode(const Tokenizer* t) : tok(t) {}
    std::string push(int32_t id) override {
      ids.push_back(id);
      const std::string now = tok->decode(ids);
      std::string out;
      if (now.size() > raw.size() && now.compare(0, raw.size(), raw) == 0) out = utf8.push(now.substr(raw.size()));
      raw = now;
      return out;
    }
    std::string finish() override { return utf8.finish(); }
  };
  return std::make_unique<Redecode>(this);
}

std::unique_ptr<Tokenizer> byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& path) {
  return parse_sentencepiece(read_file(path, kMaxTokenizerFileBytes), path);
}

std::unique_ptr<Tokenizer> parse_sentencepiece(const std::string& bytes, const std::string& name) {
  return std::make_unique<SentencePieceTokenizer>(bytes, name);
}

namespace {

class HfTokenizerAdapter : public Tokenizer {
 public:
  explicit HfTokenizerAdapter(HfTokenizer t) : t_(std::move(t)) {}
  using Tokenizer::encode;
  std::vector<int32_t> encode(const std::string& text, bool add_special) const override {
    return t_.encode(text, add_special);
  }
  std::string decode(const std::vector<int32_t>& ids) const override { return t_.decode(ids, true); }
  int64_t vocab_size() const override { return t_.vocab_size(); }
  std::string name() const override { return "tokenizer.json"; }
  int32_t eos_id() const override { return t_.eos_id(); }
  bool is_token(int32_t id) const override {
    return id >= 0 && id < t_.vocab_size() && !t_.token(id).empty();
  }
  std::string token_bytes(int32_t id) const override {
    check_token_id(id, t_.vocab_size(), "tokenizer.json");
    if (t_.is_special(id) || t_.token(id).empty()) return "";
    return t_.decode({id}, false);
  }
  const HfTokenizer* hf() const override { return &t_; }
  // Byte-level BPE (the one decoder tokenizer.json may name here) decodes token by token:
  // decode(ids) is the pieces put together.
  std::unique_ptr<TextStream> stream() const override {
    struct Tokens : TextStream {
      const HfTokenizer& t;
      Utf8Stream utf8;
      explicit Tokens(const HfTokenizer& tok) : t(tok) {}
      std::string push(int32_t id) override { return utf8.push(t.decode({id}, true)); }
      std::string finish() override { return utf8.finish(); }
    };
    return std::make_unique<Tokens>(t_);
  }

 private:
  HfTokenizer t_;
};

}  // namespace

std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path) {
  return std::make_unique<HfTokenizerAdapter>(HfTokenizer::load(path));
}

TokenizerChoice parse_tokenizer_choice(const std::string& name, const std::string& where) {
  if (name == "model") return TokenizerChoice::kModel;
  if (name == "bytes") return TokenizerChoice::kBytes;
  throw InvalidArgument(where + " is \"" + name + "\", expected model (the directory's own) or bytes");
}

std::unique_ptr<Tokenizer> tokenizer_for(const std::string& model_dir, TokenizerChoice choice) {
  if (choice == TokenizerChoice::kBytes) return byte_tokenizer();
  struct stat st {};
  if (::stat((model_dir + "/tokenizer.json").c_str(), &st) == 0) return load_hf_tokenizer(model_dir);
  const std::string p = model_dir + "/tokenizer.model";
  if (::stat(p.c_str(), &st) == 0) return load_sentencepiece(p);
  if (model::is_hf_model_dir(model_dir)) {
    throw IoError(model_dir + ": a Hugging Face model directory without a tokenizer (no tokenizer.json "
                  "and no tokenizer.model): copy the model's tokenizer.json and tokenizer_config.json "
                  "into it, or pass --tokenizer bytes to use raw bytes as token ids");
  }
  return byte_tokenizer();
}

std::unique_ptr<Tokenizer> tokenizer_for(const model::ModelDir& dir, TokenizerChoice choice) {
  if (choice == TokenizerChoice::kBytes) return byte_tokenizer();
  const std::string& p = dir.tokenizer_path;
  if (p.size() >= 15 && p.compare(p.size() - 15, 15, "/tokenizer.json") == 0) {
    HfTokenizer t = HfTokenizer::from_json(read_file(p), p);
    if (dir.tokenizer_config) t.apply_config(*dir.tokenizer_config, dir.file("tokenizer_config.json"));
    return std::make_unique<HfTokenizerAdapter>(std::move(t));
  }
  if (!p.empty()) return load_sentencepiece(p);
  if (dir.hf) {
    throw IoError(dir.path + ": a Hugging Face model directory without a tokenizer (no tokenizer.json "
                  "and no tokenizer.model): copy the model's tokenizer.json and tokenizer_config.json "
                  "into it, or pass --tokenizer bytes to use raw bytes as token ids");
  }
  return byte_tokenizer();
}

void train_sentencepiece(const std::string& text, const std::string& out_path, int64_t vocab_size,
                         uint32_t seed) {
  // The trainer reads a file and writes PREFIX.model / PREFIX.vocab; both go to a private
  // temporary directory, then the model is copied into place atomically.
  char tmpl[] = "/tmp/diffattn-sp-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) throw IoError("cannot create a temporary directory for SentencePiece");
  const std::string tmp = tmpl;
  struct Cleanup {
    std::string d;
    ~Cleanup() {
      std::error_code ec;
      std::filesystem::remove_all(d, ec);
    }
  } cleanup{tmp};
  write_file_atomic(tmp + "/input.txt", text);
  sentencepiece::SetRandomGeneratorSeed(seed);
  const std::string args = "--input=" + tmp + "/input.txt --model_prefix=" + tmp +
                           "/sp --vocab_size=" + std::to_string(vocab_size) +
                           " --model_type=unigram --character_coverage=1.0 --num_threads=1"
                           " --byte_fallback=true --input_sentence_size=200000"
                           " --shuffle_input_sentence=false --hard_vocab_limit=false --minloglevel=2";
  const auto st = sentencepiece::SentencePieceTrainer::Train(args);
  if (!st.ok()) {
    throw InvalidArgument("sentencepiece: training a " + std::to_string(vocab_size) +
                          "-piece model failed (" + st.ToString() + ")");
  }
  write_file_atomic(out_path, read_file(tmp + "/sp.model"));
}

}  // namespace diffattn::data
