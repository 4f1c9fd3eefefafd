// Reference vocabulary-parallel embedding and cross-entropy (ops.h,
// "Vocabulary-parallel"): plain loops in double, for the tests to hold the
// backends to. std-only.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

namespace loom::kernels::reference {

inline bool InVocabShard(int32_t id, int64_t vocab_offset, int64_t vocab) {
  return id >= vocab_offset && id < vocab_offset + vocab;
}

inline void EmbeddingShardForward(const int32_t* ids, int64_t num_tokens, const float* table,
                                  int64_t vocab_offset, int64_t vocab, int64_t dim, float* out) {
  for (int64_t t = 0; t < num_tokens; ++t)
    for (int64_t d = 0; d < dim; ++d)
      out[t * dim + d] = InVocabShard(ids[t], vocab_offset, vocab)
                             ? table[(ids[t] - vocab_offset) * dim + d]
                             : 0.0f;
}

inline void EmbeddingShardBackward(const int32_t* ids, int64_t num_tokens, const float* d_out,
                                   int64_t vocab_offset, int64_t vocab, int64_t dim,
                                   float* d_table) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    if (!InVocabShard(ids[t], vocab_offset, vocab)) continue;
    for (int64_t d = 0; d < dim; ++d) d_table[(ids[t] - vocab_offset) * dim + d] += d_out[t * dim + d];
  }
}

inline void CrossEntropyShardStats(const float* logits, const int32_t* targets, int64_t rows,
                                   int64_t vocab_offset, int64_t vocab, float* row_lse,
                                   float* row_target_logit) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = logits + r * vocab;
    row_target_logit[r] =
        InVocabShard(targets[r], vocab_offset, vocab) ? x[targets[r] - vocab_offset] : 0.0f;
    if (vocab == 0) {
      row_lse[r] = -std::numeric_limits<float>::infinity();
      continue;
    }
    double mx = x[0];
    for (int64_t c = 1; c < vocab; ++c) mx = x[c] > mx ? x[c] : mx;
    double sum = 0;
    for (int64_t c = 0; c < vocab; ++c) sum += std::exp(x[c] - mx);
    row_lse[r] = static_cast<float>(mx + std::log(sum));
  }
}

inline void CrossEntropyShardBackward(float* logits, const int32_t* targets, int64_t rows,
                                      int64_t vocab_offset, int64_t vocab, const float* row_lse,
                                      double grad_scale) {
  for (int64_t r = 0; r < rows; ++r) {
    float* x = logits + r * vocab;
    for (int64_t c = 0; c < vocab; ++c) {
      if (targets[r] < 0) {
        x[c] = 0.0f;
        continue;
      }
      const double onehot = targets[r] - vocab_offset == c ? 1.0 : 0.0;
      x[c] = static_cast<float>(grad_scale * (std::exp(static_cast<double>(x[c]) - row_lse[r]) - onehot));
    }
  }
}

}  // namespace loom::kernels::reference
