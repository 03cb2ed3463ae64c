// The JSON grammars of constrained output behind the scheduler's constraint interface.
#include "serve/constraint.h"

#include <utility>

namespace diffattn::serve {

namespace {

class GrammarConstraint final : public infer::OutputConstraint {
 public:
  GrammarConstraint(const grammar::Grammar& g, std::shared_ptr<const grammar::TokenMasker> masker)
      : masker_(std::move(masker)), matcher_(g) {}
  void allowed(std::vector<uint8_t>& mask) override { masker_->allowed(matcher_, mask); }
  bool advance(int32_t id) override { return masker_->advance(matcher_, id); }
  bool complete() const override { return matcher_.accepts_end(); }
  bool closed() const override {
    return matcher_.accepts_end() && matcher_.allowed_bytes().none();
  }

 private:
  std::shared_ptr<const grammar::TokenMasker> masker_;
  grammar::Matcher matcher_;
};

class GrammarSource final : public infer::ConstraintSource {
 public:
  GrammarSource(grammar::Grammar g, std::shared_ptr<const grammar::TokenMasker> masker)
      : grammar_(std::move(g)), masker_(std::move(masker)) {}
  int64_t vocab_size() const override { return masker_->vocab_size(); }
  std::unique_ptr<infer::OutputConstraint> start() const override {
    return std::make_unique<GrammarConstraint>(grammar_, masker_);
  }

 private:
  grammar::Grammar grammar_;
  std::shared_ptr<const grammar::TokenMasker> masker_;
};

}  // namespace

std::shared_ptr<const infer::ConstraintSource> grammar_constraint(
    grammar::Grammar g, std::shared_ptr<const grammar::TokenMasker> masker) {
  if (!masker) throw InvalidArgument("constrained output needs a token masker");
  return std::make_shared<const GrammarSource>(std::move(g), std::move(masker));
}

}  // namespace diffattn::serve
