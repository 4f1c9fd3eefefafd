// Bit-for-bit comparisons of a run on the emulated device with the same run
// on the CPU: the device path must change where tensors live, not a bit of
// what is computed.
#pragma once

#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "worker/engine/progress.h"

namespace loom::engine::testing {

// got[i] is want[want_first + i]: step, loss, norm, lr, tokens, validation.
inline void ExpectSameSteps(const std::vector<StepProgress>& got,
                            const std::vector<StepProgress>& want, size_t want_first) {
  ASSERT_EQ(got.size() + want_first, want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const StepProgress& w = want[want_first + i];
    EXPECT_EQ(got[i].step, w.step);
    EXPECT_EQ(got[i].loss, w.loss) << "step " << w.step;
    EXPECT_EQ(got[i].grad_norm, w.grad_norm) << "step " << w.step;
    EXPECT_EQ(got[i].lr, w.lr) << "step " << w.step;
    EXPECT_EQ(got[i].tokens, w.tokens) << "step " << w.step;
    EXPECT_EQ(got[i].val_loss, w.val_loss) << "step " << w.step;
  }
}

inline void ExpectSameBits(const std::vector<float>& a, const std::vector<float>& b) {
  ASSERT_EQ(a.size(), b.size());
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
}

}  // namespace loom::engine::testing
