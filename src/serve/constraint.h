// Constrained output (response_format json_object / json_schema) as the scheduler's constraint
// (infer::OutputConstraint): the request's grammar, matched byte by byte, over the server's
// token masker (the model's vocabulary as bytes, its end-of-sequence ids the stop ids).
#pragma once

#include <memory>

#include "diffattn/grammar/json_schema.h"
#include "diffattn/grammar/token_mask.h"
#include "diffattn/infer/scheduler.h"

namespace diffattn::serve {

// Each admitted sequence starts a matcher of g at the document's beginning.
std::shared_ptr<const infer::ConstraintSource> grammar_constraint(
    grammar::Grammar g, std::shared_ptr<const grammar::TokenMasker> masker);

}  // namespace diffattn::serve
