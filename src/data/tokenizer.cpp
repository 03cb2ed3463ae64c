// Tokenizers: bytes (the default, vocabulary 256) and SentencePiece (Debian's
// libsentencepiece), trained here on the corpus and saved as DIR/tokenizer.model.
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "diffattn/data.h"

namespace diffattn::data {

namespace {

class ByteTokenizer : public Tokenizer {
 public:
  std::vector<int32_t> encode(const std::string& text) const override {
    std::vector<int32_t> ids(text.size());
    for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
    return ids;
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string s;
    s.reserve(ids.size());
    for (int32_t id : ids) s.push_back(static_cast<char>(id & 0xff));
    return s;
  }
  int64_t vocab_size() const override { return 256; }
  std::string name() const override { return "bytes"; }
};

class SentencePieceTokenizer : public Tokenizer {
 public:
  // bytes: a serialized SentencePiece ModelProto; name: the file it came from, for messages.
  SentencePieceTokenizer(const std::string& bytes, const std::string& name) : path_(name) {
    const auto st = sp_.LoadFromSerializedProto(bytes);
    if (!st.ok()) throw IoError(name + ": cannot load the SentencePiece model (" + st.ToString() + ")");
    if (sp_.GetPieceSize() < 1) throw IoError(name + ": the SentencePiece model has no pieces");
  }
  std::vector<int32_t> encode(const std::string& text) const override {
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

 private:
  std::string path_;
  sentencepiece::SentencePieceProcessor sp_;
};

}  // namespace

std::unique_ptr<Tokenizer> byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& path) {
  return parse_sentencepiece(read_file(path, kMaxTokenizerFileBytes), path);
}

std::unique_ptr<Tokenizer> parse_sentencepiece(const std::string& bytes, const std::string& name) {
  return std::make_unique<SentencePieceTokenizer>(bytes, name);
}

std::unique_ptr<Tokenizer> tokenizer_for(const std::string& model_dir) {
  const std::string p = model_dir + "/tokenizer.model";
  struct stat st {};
  if (::stat(p.c_str(), &st) == 0) return load_sentencepiece(p);
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
