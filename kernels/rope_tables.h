// The cos/sin tables RoPE reads, computed on the host once per model and
// uploaded: entry [p, i] is cos/sin(p * theta^(-2i / head_dim)), i < head_dim/2,
// the inverse frequencies of Hugging Face's LlamaRotaryEmbedding. Computed in
// double and rounded once, so every backend sees the same table. std-only.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace loom::kernels {

struct RopeTables {
  int64_t max_positions = 0;
  int64_t half_dim = 0;
  std::vector<float> cos;  // [max_positions, half_dim]
  std::vector<float> sin;
};

inline RopeTables MakeRopeTables(int64_t max_positions, int64_t head_dim, double theta) {
  RopeTables t;
  t.max_positions = max_positions;
  t.half_dim = head_dim / 2;
  t.cos.resize(static_cast<size_t>(max_positions * t.half_dim));
  t.sin.resize(t.cos.size());
  for (int64_t p = 0; p < max_positions; ++p) {
    for (int64_t i = 0; i < t.half_dim; ++i) {
      const double inv_freq = std::pow(theta, -2.0 * static_cast<double>(i) / head_dim);
      const double angle = static_cast<double>(p) * inv_freq;
      t.cos[p * t.half_dim + i] = static_cast<float>(std::cos(angle));
      t.sin[p * t.half_dim + i] = static_cast<float>(std::sin(angle));
    }
  }
  return t;
}

}  // namespace loom::kernels
