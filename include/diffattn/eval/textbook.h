// The textbook's worked example ("The cat sat on mat", Chapter 14.15; docs/claims.md):
// five tokens, Q and K of width 4 split into two halves of 2 (map 1: columns 0-1, map 2:
// columns 2-3), V of width 4, lambda = 0.4. As tensors of the operator contract with B = 1,
// H = G = 1: q (1, 5, 2, 2), k (1, 5, 2, 2), v (1, 5, 1, 4); standard attention uses the full
// width: q, k (1, 5, 1, 4).
#pragma once

#include <array>

namespace diffattn::eval::textbook {

inline constexpr int kTokens = 5;
inline constexpr std::array<const char*, kTokens> kWords = {"The", "cat", "sat", "on", "mat"};
inline constexpr float kLambda = 0.4f;

// (5, 4) row-major: (T, 2, 2) as sub-heads, or (T, 1, 4) as one head.
inline constexpr std::array<float, 20> kQ = {
    1, 0, 1, 0,  // The
    0, 2, 0, 1,  // cat
    1, 1, 1, 0,  // sat
    0, 0, 1, 1,  // on
    1, 0, 0, 1,  // mat
};
inline constexpr std::array<float, 20> kK = {
    0, 1, 0,    1,    // The
    1, 0, 1,    0,    // cat
    1, 1, 0,    0,    // sat
    0, 0, 1,    1,    // on
    1, 0, 0.5f, 0.5f, // mat
};
inline constexpr std::array<float, 20> kV = {
    1,    0,    0,    0,     // The
    0,    1,    0,    0,     // cat
    0,    0,    1,    0,     // sat
    0,    0,    0,    1,     // on
    0.5f, 0.5f, 0.5f, 0.5f,  // mat
};

}  // namespace diffattn::eval::textbook
