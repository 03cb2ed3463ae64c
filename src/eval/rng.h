// The experiments' generator is the library's one seeded RNG (include/diffattn/rng.h).
#pragma once

#include "diffattn/rng.h"

namespace diffattn::eval {
using diffattn::Rng;
}  // namespace diffattn::eval
