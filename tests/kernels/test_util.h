// Helpers shared by the kernel tests: seeded random tensors and error norms.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace loom::kernels::testing {

inline std::vector<float> RandomVector(int64_t n, uint32_t seed, float lo = -1.0f,
                                       float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(gen);
  return v;
}

inline std::vector<int32_t> RandomIds(int64_t n, int32_t vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> dist(0, vocab - 1);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int32_t& x : v) x = dist(gen);
  return v;
}

// max |a - b| / max(max |b|, floor): relative to the tensor's scale, so tiny
// entries do not blow up the ratio.
template <typename A, typename B>
double MaxRelDiff(const A& a, const B& b, double floor = 1e-6) {
  double diff = 0, scale = floor;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return diff / scale;
}

template <typename A>
std::vector<double> ToDouble(const A& a) {
  return std::vector<double>(a.begin(), a.end());
}

}  // namespace loom::kernels::testing
