// diffattn tokenize: a Hugging Face tokenizer.json's ids for a text, and the text of ids.
#include <iostream>
#include <sstream>

#include "cli/args.h"
#include "diffattn/base/error.h"
#include "diffattn/data/hf_tokenizer.h"

namespace diffattn::cli {

namespace {

int run_tokenize(const std::vector<std::string>& argv) {
  Args args("tokenize",
            "Encode a text with a Hugging Face tokenizer.json (byte-level BPE: GPT-2, Llama 3 and\n"
            "their copies) and print the ids, one line, space-separated; or decode ids back to\n"
            "text. The ids equal the tokenizers library's.");
  args.option("--tokenizer", "PATH", "", "a tokenizer.json, or a directory holding one")
      .option("--text", "TEXT", "", "the text to encode")
      .option("--decode", "IDS", "", "space- or comma-separated ids to decode instead")
      .flag("--special", "add the file's special tokens (Llama 3: <|begin_of_text|> in front)")
      .flag("--tokens", "print each id with its token string");
  if (!args.parse(argv)) return 0;
  if (!args.given("--tokenizer")) throw UsageError("--tokenizer PATH is required");
  if (args.given("--text") == args.given("--decode")) {
    throw UsageError("give one of --text or --decode");
  }
  const data::HfTokenizer tok = data::HfTokenizer::load(args.str("--tokenizer"));
  if (args.given("--decode")) {
    std::string s = args.str("--decode");
    for (char& c : s) c = c == ',' ? ' ' : c;
    std::istringstream in(s);
    std::vector<int32_t> ids;
    std::string w;
    while (in >> w) {
      size_t used = 0;
      long long v = 0;
      try {
        v = std::stoll(w, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != w.size() || v < 0 || v >= tok.vocab_size()) {
        throw UsageError("--decode: \"" + w + "\" is not an id of 0.." +
                         std::to_string(tok.vocab_size() - 1));
      }
      ids.push_back(static_cast<int32_t>(v));
    }
    std::cout << tok.decode(ids) << "\n";
    return 0;
  }
  const std::vector<int32_t> ids = tok.encode(args.str("--text"), args.on("--special"));
  for (size_t i = 0; i < ids.size(); ++i) {
    std::cout << (i ? " " : "") << ids[i];
    if (args.on("--tokens")) std::cout << ":" << tok.token(ids[i]);
  }
  std::cout << "\n";
  return 0;
}

const CommandRegistration reg({"tokenize", "ids of a text under a Hugging Face tokenizer.json",
                               45, run_tokenize});

}  // namespace

}  // namespace diffattn::cli
