// Argument checks and the choice between the two block-scaled FP8 GEMM
// kernels.
#include "kernels/cuda/fp8/fp8_gemm_common.cuh"

namespace loom::kernels::cuda {

namespace {

cudaError_t CheckAndLaunch(Fp8GemmParams p, const void* d, Fp8GemmImpl impl, cudaStream_t stream) {
  auto aligned = [](const void* ptr) { return ptr != nullptr && (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; };
  const int m = p.m, n = p.n, k = p.k;
  if (m < kFp8Tile || n < kFp8Tile || k < kFp8Tile || m % kFp8Tile || n % kFp8Tile || k % kFp8Tile ||
      m / kFp8Tile > 65535 || !aligned(p.a) || !aligned(p.b) || !aligned(p.a_scales) || !aligned(p.b_scales) ||
      !aligned(d))
    return cudaErrorInvalidValue;
  // The mma.sync path stays the default until the wgmma path has passed
  // tests/gpu on a device (kernels/RESULTS.md).
  if (impl == Fp8GemmImpl::kWgmma) return LaunchFp8GemmWgmma(p, stream);
  return LaunchFp8GemmMma(p, stream);
}

}  // namespace

cudaError_t Fp8BlockScaledGemm(const uint8_t* a, const float* a_scales, const uint8_t* b, const float* b_scales,
                               Fp8BScales b_layout, int m, int n, int k, __nv_bfloat16* d, cudaStream_t stream,
                               Fp8GemmImpl impl) {
  Fp8GemmParams p{a, a_scales, b, b_scales, d, m, n, k, b_layout == Fp8BScales::kTile1x128};
  return CheckAndLaunch(p, d, impl, stream);
}

cudaError_t Fp8BlockScaledGemm(const uint8_t* a, const float* a_scales, const uint8_t* b, const float* b_scales,
                               Fp8BScales b_layout, int m, int n, int k, float* d, cudaStream_t stream,
                               Fp8GemmImpl impl) {
  Fp8GemmParams p{a, a_scales, b, b_scales, nullptr, m, n, k, b_layout == Fp8BScales::kTile1x128, d};
  return CheckAndLaunch(p, d, impl, stream);
}

}  // namespace loom::kernels::cuda
