// Small SIMD building blocks of the CPU backend, written with GCC/Clang vector
// extensions so they compile to AVX-512 where -march allows and to narrower
// vectors elsewhere: a vectorizable exp, and the 64-column panel product that
// every attention tile product reduces to. Internal to kernels/cpu.
#pragma once

#include <cstdint>
#include <cstring>

namespace loom::kernels::cpu {

using V16 = float __attribute__((vector_size(64)));

inline V16 LoadV16(const float* p) {
  V16 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void StoreV16(float* p, V16 v) { std::memcpy(p, &v, sizeof(v)); }

using V16i = int32_t __attribute__((vector_size(64)));

inline V16 BroadcastV16(float x) { return V16{} + x; }

// exp(x) to about 2 ulp for x in [-87, 88] (clamped outside), branch-free:
// 2^n * e^r with n = round(x / ln2) by the 1.5 * 2^23 trick (whose low
// mantissa bits are then n itself), r = x - n ln2 in two parts (Cody-Waite),
// and a degree-6 polynomial for e^r. The vector and scalar forms do the same
// operations, so results do not depend on which one an element goes through.
inline V16 FastExpV(V16 x) {
  const V16 lo = BroadcastV16(-87.0f), hi = BroadcastV16(88.0f);
  const V16 magic = BroadcastV16(12582912.0f);
  x = x < lo ? lo : x;
  x = x > hi ? hi : x;
  const V16 shifted = x * 1.44269504088896341f + magic;
  const V16 n = shifted - magic;
  const V16 r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  V16 p = BroadcastV16(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // A C-style cast between vector types of one size reinterprets the bits.
  const V16i bits = (((V16i)shifted - (V16i)magic) + 127) << 23;
  return p * (V16)bits;
}

inline float FastExp(float x) {
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  const float magic = 12582912.0f;
  const float shifted = x * 1.44269504088896341f + magic;
  const float n = shifted - magic;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t shifted_bits, magic_bits;
  std::memcpy(&shifted_bits, &shifted, sizeof(float));
  std::memcpy(&magic_bits, &magic, sizeof(float));
  const int32_t bits = (shifted_bits - magic_bits + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// y[i] = exp(x[i] - shift); x and y may alias.
inline void ExpShifted(const float* x, float shift, int64_t n, float* y) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) StoreV16(y + i, FastExpV(LoadV16(x + i) - shift));
  for (; i < n; ++i) y[i] = FastExp(x[i] - shift);
}

// Fixed-order reductions: 16 lanes, then the lanes in order. Plain loops
// would stay scalar (float addition is not reassociated without fast-math).
inline float HorizontalSum(V16 v) {
  float s = 0.0f;
  for (int i = 0; i < 16; ++i) s += v[i];
  return s;
}

inline float SumV(const float* x, int64_t n) {
  V16 acc = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) acc += LoadV16(x + i);
  float s = HorizontalSum(acc);
  for (; i < n; ++i) s += x[i];
  return s;
}

inline float DotV(const float* a, const float* b, int64_t n) {
  V16 acc = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) acc += LoadV16(a + i) * LoadV16(b + i);
  float s = HorizontalSum(acc);
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Max of x[0..n), n >= 1; no NaN handling needed for finite activations.
inline float MaxV(const float* x, int64_t n) {
  float m = x[0];
  int64_t i = 0;
  if (n >= 16) {
    V16 acc = LoadV16(x);
    for (i = 16; i + 16 <= n; i += 16) {
      const V16 v = LoadV16(x + i);
      acc = acc > v ? acc : v;
    }
    m = acc[0];
    for (int l = 1; l < 16; ++l) m = m > acc[l] ? m : acc[l];
  }
  for (; i < n; ++i) m = m > x[i] ? m : x[i];
  return m;
}

constexpr int kPanel = 64;

// C[r][0:64] (+)= sum_{k<K} A(r, k) * B[k][0:64] for r < rows, where
// A(r, k) = a[r * a_row_stride + k * a_k_stride] and B is a dense [K][64]
// panel. Four rows at a time keep 16 accumulators in registers.
inline void Panel64(int64_t rows, int64_t K, const float* a, int64_t a_row_stride,
                    int64_t a_k_stride, const float* b, float* c, bool accumulate) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    V16 acc[4][4];
    for (int i = 0; i < 4; ++i)
      for (int q = 0; q < 4; ++q)
        acc[i][q] = accumulate ? LoadV16(c + (r + i) * kPanel + 16 * q) : V16{};
    const float* a0 = a + r * a_row_stride;
    for (int64_t k = 0; k < K; ++k) {
      const float* bk = b + k * kPanel;
      const V16 b0 = LoadV16(bk), b1 = LoadV16(bk + 16), b2 = LoadV16(bk + 32),
                b3 = LoadV16(bk + 48);
      const float* ak = a0 + k * a_k_stride;
      for (int i = 0; i < 4; ++i) {
        const float x = ak[i * a_row_stride];
        acc[i][0] += x * b0;
        acc[i][1] += x * b1;
        acc[i][2] += x * b2;
        acc[i][3] += x * b3;
      }
    }
    for (int i = 0; i < 4; ++i)
      for (int q = 0; q < 4; ++q) StoreV16(c + (r + i) * kPanel + 16 * q, acc[i][q]);
  }
  for (; r < rows; ++r) {
    V16 acc[4];
    for (int q = 0; q < 4; ++q) acc[q] = accumulate ? LoadV16(c + r * kPanel + 16 * q) : V16{};
    for (int64_t k = 0; k < K; ++k) {
      const float x = a[r * a_row_stride + k * a_k_stride];
      for (int q = 0; q < 4; ++q) acc[q] += x * LoadV16(b + k * kPanel + 16 * q);
    }
    for (int q = 0; q < 4; ++q) StoreV16(c + r * kPanel + 16 * q, acc[q]);
  }
}

}  // namespace loom::kernels::cpu
