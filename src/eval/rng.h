// The experiments' generator is the library's one seeded RNG (include/diffattn/base/rng.h).
#pragma once

#include "diffattn/base/rng.h"

namespace diffattn::eval {
using diffattn::Rng;
}  // namespace diffattn::eval
