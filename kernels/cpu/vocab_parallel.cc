// Vocabulary-parallel embedding and cross-entropy on one rank's vocabulary
// shard: the lookup and its gradient for the ids that fall in the shard, and
// the per-row statistics (shard log-sum-exp, target logit) from which the
// ranks assemble the exact softmax without ever gathering the logits.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/simd.h"

namespace loom::kernels::cpu {
namespace {

constexpr int64_t kColChunk = 64;

bool InShard(int32_t id, int64_t vocab_offset, int64_t vocab) {
  return id >= vocab_offset && id < vocab_offset + vocab;
}

}  // namespace

void EmbeddingShardForward(const int32_t* ids, int64_t num_tokens, const float* table,
                           int64_t vocab_offset, int64_t vocab, int64_t dim, float* out) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < num_tokens; ++t) {
    float* dst = out + t * dim;
    if (InShard(ids[t], vocab_offset, vocab)) {
      const float* src = table + (ids[t] - vocab_offset) * dim;
      std::copy(src, src + dim, dst);
    } else {
      std::fill(dst, dst + dim, 0.0f);
    }
  }
}

// Column blocks per thread, tokens in order within each: deterministic
// without atomics, as the unsharded backward.
void EmbeddingShardBackward(const int32_t* ids, int64_t num_tokens, const float* d_out,
                            int64_t vocab_offset, int64_t vocab, int64_t dim, float* d_table) {
  const int64_t num_blocks = (dim + kColChunk - 1) / kColChunk;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < num_blocks; ++blk) {
    const int64_t c0 = blk * kColChunk, c1 = std::min(dim, c0 + kColChunk);
    for (int64_t t = 0; t < num_tokens; ++t) {
      if (!InShard(ids[t], vocab_offset, vocab)) continue;
      float* dst = d_table + (ids[t] - vocab_offset) * dim;
      const float* src = d_out + t * dim;
      for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
    }
  }
}

void CrossEntropyShardStats(const float* logits, const int32_t* targets, int64_t rows,
                            int64_t vocab_offset, int64_t vocab, float* row_lse,
                            float* row_target_logit) {
#pragma omp parallel
  {
    std::vector<float> exps;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float* x = logits + r * vocab;
      const int32_t target = targets[r];
      row_target_logit[r] =
          InShard(target, vocab_offset, vocab) ? x[target - vocab_offset] : 0.0f;
      if (vocab == 0) {
        row_lse[r] = -std::numeric_limits<float>::infinity();
        continue;
      }
      const float mx = MaxV(x, vocab);
      exps.resize(static_cast<size_t>(vocab));
      ExpShifted(x, mx, vocab, exps.data());
      row_lse[r] = mx + std::log(SumV(exps.data(), vocab));
    }
  }
}

void CrossEntropyShardBackward(float* logits, const int32_t* targets, int64_t rows,
                               int64_t vocab_offset, int64_t vocab, const float* row_lse,
                               float grad_scale) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    float* x = logits + r * vocab;
    const int32_t target = targets[r];
    if (target < 0) {
      std::fill(x, x + vocab, 0.0f);
      continue;
    }
    ExpShifted(x, row_lse[r], vocab, x);
    for (int64_t c = 0; c < vocab; ++c) x[c] *= grad_scale;
    if (InShard(target, vocab_offset, vocab)) x[target - vocab_offset] -= grad_scale;
  }
}

}  // namespace loom::kernels::cpu
