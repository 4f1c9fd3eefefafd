// A small, fully specified random generator for parameter init, so weights
// depend on the seed alone and not on the standard library's distribution
// implementations (std::normal_distribution differs between libraries).
#pragma once

#include <cmath>
#include <cstdint>

namespace loom::engine {

// SplitMix64 stream; normals by Box-Muller from 53-bit uniforms in double.
class NormalGenerator {
 public:
  explicit NormalGenerator(uint64_t seed) : state_(seed) {}

  uint64_t NextU64() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in (0, 1]: never 0, so log() below is finite.
  double NextUniform() { return (static_cast<double>(NextU64() >> 11) + 1.0) * 0x1.0p-53; }

  double NextNormal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double r = std::sqrt(-2.0 * std::log(NextUniform()));
    const double angle = 2.0 * 3.14159265358979323846 * NextUniform();
    spare_ = r * std::sin(angle);
    has_spare_ = true;
    return r * std::cos(angle);
  }

 private:
  uint64_t state_;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

// Each tensor gets its own stream from (seed, tensor index), so adding or
// reordering tensors never changes the others' values.
inline uint64_t TensorSeed(uint64_t seed, uint64_t tensor_index) {
  NormalGenerator mix(seed ^ (0xD1B54A32D192ED03ull * (tensor_index + 1)));
  return mix.NextU64();
}

}  // namespace loom::engine
