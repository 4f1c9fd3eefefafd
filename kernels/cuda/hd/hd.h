// Shared by the CUDA kernels and their host tests: LOOM_HD marks functions that
// compile both for the device (nvcc) and for the host (plain g++), so the logic
// the kernels rely on is unit-tested on machines without a GPU. Everything
// under kernels/cuda/hd/ is std-only.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define LOOM_HD __host__ __device__ __forceinline__
#else
#define LOOM_HD inline
#endif

namespace loom::kernels::cuda {

// Correctly rounded division and product, also under --use_fast_math, so that
// host and device compute the same bits (the FP8 scales are compared exactly).
LOOM_HD float DivRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

LOOM_HD float MulRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

LOOM_HD float Exp2(float x) {
#if defined(__CUDA_ARCH__)
  return exp2f(x);
#else
  return std::exp2(x);
#endif
}

LOOM_HD float FloatBitsNegInf() { return -INFINITY; }

LOOM_HD uint32_t FloatToBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  return u;
#endif
}

LOOM_HD float BitsToFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
#endif
}

}  // namespace loom::kernels::cuda
