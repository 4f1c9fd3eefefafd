// FP8 quantizers and block-scaled GEMMs against the std-only reference
// (kernels/cuda/reference/fp8_reference.h).
//
// Quantization must match the reference bit for bit (same scales, same
// codes): both use correctly rounded fp32 operations and round-to-nearest-
// even with saturation. The GEMM is compared with the reference's exact
// block sums; the kernel differs only by fp32 summation order and its bf16
// output (relative error <= 2^-9 per element), so 5e-3 relative (Frobenius).
#include <cuda_fp8.h>

#include <limits>

#include "kernels/cuda/fp8/fp8.h"
#include "kernels/cuda/reference/fp8_reference.h"
#include "tests/gpu/gpu_test.h"

namespace loom::gpu_test {
namespace {

namespace kc = kernels::cuda;
namespace kref = kernels::cuda::reference;

__global__ void HardwareE4m3(const float* in, uint8_t* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(in[i], __NV_SATFINITE, __NV_E4M3));
}

GPU_TEST(Fp8HardwareConversionMatchesHostRounding) {
  std::vector<float> xs;
  for (int c = 0; c < 0x7f; ++c) {
    const float v = kc::E4m3ToFloat(static_cast<uint8_t>(c));
    const float next = kc::E4m3ToFloat(static_cast<uint8_t>(c + 1));
    const float mid = (v + next) / 2;
    for (float x : {v, mid, std::nextafter(mid, 0.f), std::nextafter(mid, 1e9f)}) {
      xs.push_back(x);
      xs.push_back(-x);
    }
  }
  for (float x : {460.f, 470.f, 1e5f, std::numeric_limits<float>::infinity(), 1e-30f}) {
    xs.push_back(x);
    xs.push_back(-x);
  }
  std::vector<float> rnd = RandomFloats(20000, 5, 50.0f);
  xs.insert(xs.end(), rnd.begin(), rnd.end());
  DeviceBuffer<float> in(xs.size());
  DeviceBuffer<uint8_t> out(xs.size());
  in.Upload(xs);
  out.Poison();
  HardwareE4m3<<<static_cast<unsigned>((xs.size() + 255) / 256), 256>>>(in.get(), out.get(), static_cast<int>(xs.size()));
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint8_t> got = out.Download();
  for (size_t i = 0; i < xs.size(); ++i)
    CHECK(got[i] == kc::FloatToE4m3(xs[i]), "x=" << xs[i] << " hw=" << int(got[i]) << " host=" << int(kc::FloatToE4m3(xs[i])));
}

void CheckQuantized(const char* what, const kref::Fp8Tensor& want, DeviceBuffer<uint8_t>& codes,
                    DeviceBuffer<float>& scales) {
  std::vector<uint8_t> got_codes = codes.Download();
  std::vector<float> got_scales = scales.Download();
  CHECK(got_scales.size() == want.scales.size(), what);
  for (size_t i = 0; i < want.scales.size(); ++i)
    CHECK(got_scales[i] == want.scales[i], what << ": scale " << i << " " << got_scales[i] << " vs " << want.scales[i]);
  size_t mismatches = 0;
  for (size_t i = 0; i < want.codes.size(); ++i) mismatches += got_codes[i] != want.codes[i];
  std::printf("    %-28s %zu codes, %zu scales, %zu mismatches\n", what, want.codes.size(), want.scales.size(), mismatches);
  CHECK(mismatches == 0, what << ": " << mismatches << " codes differ");
}

GPU_TEST(Fp8QuantizeActivationBitExact) {
  for (auto [rows, cols] : {std::pair{256, 512}, std::pair{77, 300}}) {
    std::vector<float> x = RandomFloats(static_cast<size_t>(rows) * cols, rows, 3.0f, true);
    x[5] = 8192.0f;  // (bf16-exact) an outlier that saturates its tile's scale, not its neighbours'
    DeviceBuffer<__nv_bfloat16> dx(x.size());
    dx.Upload(ToBf16(x));
    for (bool transpose : {false, true}) {
      const kref::Fp8Tensor want = kref::QuantizeActivation(x.data(), rows, cols, transpose);
      DeviceBuffer<uint8_t> codes(want.codes.size());
      DeviceBuffer<float> scales(want.scales.size());
      codes.Poison();
      scales.Poison();
      LAUNCH_OK(kc::QuantizeActivationFp8(dx.get(), rows, cols, transpose, codes.get(), scales.get(), nullptr));
      CheckQuantized(transpose ? "activation^T" : "activation", want, codes, scales);
    }
  }
}

GPU_TEST(Fp8QuantizeWeightBitExact) {
  for (auto [n, k] : {std::pair{256, 384}, std::pair{200, 130}}) {
    std::vector<float> w = RandomFloats(static_cast<size_t>(n) * k, n + k, 0.02f, false);
    std::vector<float> w_bf = RandomFloats(static_cast<size_t>(n) * k, n + k + 1, 0.02f, true);
    DeviceBuffer<float> dw(w.size());
    DeviceBuffer<__nv_bfloat16> dw_bf(w.size());
    dw.Upload(w);
    dw_bf.Upload(ToBf16(w_bf));
    for (bool transpose : {false, true}) {
      for (bool bf16 : {false, true}) {
        const kref::Fp8Tensor want = kref::QuantizeWeight(bf16 ? w_bf.data() : w.data(), n, k, transpose);
        DeviceBuffer<uint8_t> codes(want.codes.size());
        DeviceBuffer<float> scales(want.scales.size());
        codes.Poison();
        scales.Poison();
        if (bf16)
          LAUNCH_OK(kc::QuantizeWeightFp8(dw_bf.get(), n, k, transpose, codes.get(), scales.get(), nullptr));
        else
          LAUNCH_OK(kc::QuantizeWeightFp8(dw.get(), n, k, transpose, codes.get(), scales.get(), nullptr));
        CheckQuantized(transpose ? (bf16 ? "weight^T bf16" : "weight^T fp32") : (bf16 ? "weight bf16" : "weight fp32"),
                       want, codes, scales);
      }
    }
  }
}

// Runs one GEMM shape on already-quantized host tensors with each kernel.
void CheckGemm(const char* what, const kref::Fp8Tensor& a, const kref::Fp8Tensor& b, kref::Fp8BScales mode) {
  const std::vector<float> want = kref::Fp8GemmFloat(a, b, mode);
  DeviceBuffer<uint8_t> da(a.codes.size()), db(b.codes.size());
  DeviceBuffer<float> sa(a.scales.size()), sb(b.scales.size());
  da.Upload(a.codes);
  db.Upload(b.codes);
  sa.Upload(a.scales);
  sb.Upload(b.scales);
  const kc::Fp8BScales layout =
      mode == kref::Fp8BScales::kTile1x128 ? kc::Fp8BScales::kTile1x128 : kc::Fp8BScales::kBlock128x128;
  for (kc::Fp8GemmImpl impl : {kc::Fp8GemmImpl::kMmaSync, kc::Fp8GemmImpl::kWgmma}) {
    DeviceBuffer<__nv_bfloat16> d(static_cast<size_t>(a.rows) * b.rows);
    d.Poison();
    LAUNCH_OK(kc::Fp8BlockScaledGemm(da.get(), sa.get(), db.get(), sb.get(), layout, a.rows, b.rows, a.cols, d.get(),
                                     nullptr, impl));
    std::string label = std::string(what) + (impl == kc::Fp8GemmImpl::kWgmma ? " wgmma" : " mma.sync");
    ExpectClose(label.c_str(), FromBf16(d.Download()), want, 5e-3);
  }
}

GPU_TEST(Fp8GemmTrainingShapes) {
  const int t = 256, n = 384, k = 512;  // tokens, out features, in features
  const std::vector<float> x = RandomFloats(static_cast<size_t>(t) * k, 1, 1.0f, true);
  const std::vector<float> w = RandomFloats(static_cast<size_t>(n) * k, 2, 0.02f);
  const std::vector<float> dy = RandomFloats(static_cast<size_t>(t) * n, 3, 1e-3f, true);
  CheckGemm("forward", kref::QuantizeActivation(x.data(), t, k, false), kref::QuantizeWeight(w.data(), n, k, false),
            kref::Fp8BScales::kBlock128x128);
  CheckGemm("dgrad", kref::QuantizeActivation(dy.data(), t, n, false), kref::QuantizeWeight(w.data(), n, k, true),
            kref::Fp8BScales::kBlock128x128);
  CheckGemm("wgrad", kref::QuantizeActivation(dy.data(), t, n, true), kref::QuantizeActivation(x.data(), t, k, true),
            kref::Fp8BScales::kTile1x128);
}

GPU_TEST(Fp8GemmRejectsRaggedShapes) {
  DeviceBuffer<uint8_t> buf(256 * 256);
  DeviceBuffer<float> s(64);
  DeviceBuffer<__nv_bfloat16> d(256 * 256);
  CHECK(kc::Fp8BlockScaledGemm(buf.get(), s.get(), buf.get(), s.get(), kc::Fp8BScales::kBlock128x128, 200, 128, 128,
                               d.get(), nullptr) == cudaErrorInvalidValue,
        "m = 200 must be rejected");
}

}  // namespace
}  // namespace loom::gpu_test
