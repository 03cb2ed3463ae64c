// Runs a test body once per SIMD target: the kernels dispatch at run time (Highway), and each
// target has code of its own (vector widths 16, 8 and 1 lanes), so each is checked.
#pragma once

#include <gtest/gtest.h>

#include "hwy/targets.h"

namespace diffattn::testing {

// Runs f once per SIMD target compiled in and supported by this CPU (AVX-512, AVX2, the
// portable fallback), by restricting Highway's runtime dispatch to that target. The test's
// own translation unit must see the library's target set (HWY_DISABLED_TARGETS in CMake).
template <class F>
void for_each_target(F&& f) {
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    hwy::GetChosenTarget().Update(hwy::SupportedTargets());
    SCOPED_TRACE(hwy::TargetName(target));
    f();
  }
  hwy::SetSupportedTargetsForTest(0);
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
}

}  // namespace diffattn::testing
