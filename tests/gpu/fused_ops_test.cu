// RMSNorm, RoPE, SwiGLU, cross-entropy and multi-tensor AdamW against the
// std-only references (kernels/reference/), in fp32 and in bf16.
//
// Tolerances (relative Frobenius norm): fp32 paths differ from the double
// references only by fp32 rounding and fast-math exp/sigmoid (~1e-6 each), so
// 1e-5; bf16 outputs add one rounding (relative <= 2^-9), so 5e-3. AdamW
// follows the CPU backend's fp32 operation order: 1e-6.
#include <cmath>
#include <memory>

#include "kernels/cuda/ops/fused_ops.h"
#include "kernels/reference/dense.h"
#include "kernels/reference/loss_optim.h"
#include "kernels/rope_tables.h"
#include "tests/gpu/gpu_test.h"

namespace loom::gpu_test {
namespace {

namespace kc = kernels::cuda;
namespace kref = kernels::reference;

// Device tensors of either activation type, from/to host floats.
template <typename T>
struct Act;
template <>
struct Act<float> {
  static void Up(DeviceBuffer<float>& d, const std::vector<float>& h) { d.Upload(h); }
  static std::vector<float> Down(const DeviceBuffer<float>& d) { return d.Download(); }
  static constexpr double kTol = 1e-5;
  static constexpr bool kBf16 = false;
};
template <>
struct Act<__nv_bfloat16> {
  static void Up(DeviceBuffer<__nv_bfloat16>& d, const std::vector<float>& h) { d.Upload(ToBf16(h)); }
  static std::vector<float> Down(const DeviceBuffer<__nv_bfloat16>& d) { return FromBf16(d.Download()); }
  static constexpr double kTol = 5e-3;
  static constexpr bool kBf16 = true;
};

template <typename T>
void RmsNormCase() {
  const int64_t rows = 37, dim = 1032;  // dim not a multiple of the 2048-column sweep
  const auto x = RandomFloats(rows * dim, 1, 1.0f, Act<T>::kBf16);
  const auto w = RandomFloats(dim, 2, 1.0f);
  const auto dy = RandomFloats(rows * dim, 3, 1.0f, Act<T>::kBf16);
  DeviceBuffer<T> dx_in(rows * dim), dy_dev(rows * dim), y(rows * dim), dx(rows * dim);
  DeviceBuffer<float> dw(dim), rstd(rows), dwgrad(dim);
  DeviceBuffer<unsigned char> ws(kc::RmsNormBackwardWorkspaceBytes(dim));
  Act<T>::Up(dx_in, x);
  Act<T>::Up(dy_dev, dy);
  dw.Upload(w);
  y.Poison();
  rstd.Poison();
  LAUNCH_OK(kc::RmsNormForward<T>(dx_in.get(), dw.get(), rows, dim, 1e-5f, y.get(), rstd.get(), nullptr));
  std::vector<float> ry(rows * dim), rr(rows);
  kref::RmsNormForward(x.data(), w.data(), rows, dim, 1e-5f, ry.data(), rr.data());
  ExpectClose("rmsnorm y", Act<T>::Down(y), ry, Act<T>::kTol);
  ExpectClose("rmsnorm rstd", rstd.Download(), rr, 1e-5);

  // d_weight accumulates: start from a known non-zero value.
  const auto dw0 = RandomFloats(dim, 4, 1.0f);
  dwgrad.Upload(dw0);
  dx.Poison();
  ws.Poison();
  LAUNCH_OK(kc::RmsNormBackward<T>(dy_dev.get(), dx_in.get(), dw.get(), rstd.get(), rows, dim, dx.get(), false,
                                   dwgrad.get(), ws.get(), nullptr));
  std::vector<float> rdx(rows * dim), rdw = dw0;
  kref::RmsNormBackward(dy.data(), x.data(), w.data(), rows, dim, 1e-5f, rdx.data(), rdw.data());
  ExpectClose("rmsnorm dx", Act<T>::Down(dx), rdx, Act<T>::kTol);
  ExpectClose("rmsnorm dweight (+=)", dwgrad.Download(), rdw, 1e-5);
}

GPU_TEST(RmsNormFp32) { RmsNormCase<float>(); }
GPU_TEST(RmsNormBf16) { RmsNormCase<__nv_bfloat16>(); }

template <typename T>
void RopeCase() {
  const int64_t batch = 2, seq = 50, heads = 3, head_dim = 128, stride = 5 * 128, offset = 7;
  const auto tables = kernels::MakeRopeTables(seq + offset, head_dim, 500000.0);
  const auto x = RandomFloats(batch * seq * stride, 5, 1.0f, Act<T>::kBf16);
  DeviceBuffer<T> dx(x.size());
  DeviceBuffer<float> cos(tables.cos.size()), sin(tables.sin.size());
  cos.Upload(tables.cos);
  sin.Upload(tables.sin);
  for (bool inverse : {false, true}) {
    Act<T>::Up(dx, x);
    if (inverse)
      LAUNCH_OK(kc::RopeBackward<T>(dx.get(), batch, seq, heads, head_dim, stride, cos.get(), sin.get(), offset, nullptr));
    else
      LAUNCH_OK(kc::RopeForward<T>(dx.get(), batch, seq, heads, head_dim, stride, cos.get(), sin.get(), offset, nullptr));
    std::vector<float> want = x;  // columns past heads * head_dim stay untouched
    kref::Rope(want.data(), batch, seq, heads, head_dim, stride, 500000.0, offset, inverse);
    ExpectClose(inverse ? "rope backward" : "rope forward", Act<T>::Down(dx), want, Act<T>::kTol);
  }
}

GPU_TEST(RopeFp32) { RopeCase<float>(); }
GPU_TEST(RopeBf16) { RopeCase<__nv_bfloat16>(); }

template <typename T>
void SwiGluCase() {
  const int64_t rows = 33, dim = 264, in_stride = 2 * dim, out_stride = dim;
  const auto gu = RandomFloats(rows * in_stride, 6, 2.0f, Act<T>::kBf16);  // [gate | up] per row
  const auto d_out = RandomFloats(rows * out_stride, 7, 1.0f, Act<T>::kBf16);
  DeviceBuffer<T> dgu(gu.size()), dout(d_out.size()), out(rows * out_stride), grads(gu.size());
  Act<T>::Up(dgu, gu);
  Act<T>::Up(dout, d_out);
  out.Poison();
  grads.Poison();
  LAUNCH_OK(kc::SwiGluForward<T>(rows, dim, dgu.get(), dgu.get() + dim, in_stride, out.get(), out_stride, nullptr));
  LAUNCH_OK(kc::SwiGluBackward<T>(rows, dim, dgu.get(), dgu.get() + dim, in_stride, dout.get(), out_stride,
                                  grads.get(), grads.get() + dim, nullptr));
  std::vector<float> want(rows * out_stride), want_g(gu.size());
  kref::SwiGluForward(rows, dim, gu.data(), gu.data() + dim, in_stride, want.data(), out_stride);
  kref::SwiGluBackward(rows, dim, gu.data(), gu.data() + dim, in_stride, d_out.data(), out_stride, want_g.data(),
                       want_g.data() + dim);
  ExpectClose("swiglu out", Act<T>::Down(out), want, Act<T>::kTol);
  ExpectClose("swiglu d[gate|up]", Act<T>::Down(grads), want_g, Act<T>::kTol);
}

GPU_TEST(SwiGluFp32) { SwiGluCase<float>(); }
GPU_TEST(SwiGluBf16) { SwiGluCase<__nv_bfloat16>(); }

template <typename T>
void CrossEntropyCase() {
  const int64_t rows = 19, vocab = 5000;
  const auto logits = RandomFloats(rows * vocab, 8, 3.0f, Act<T>::kBf16);
  std::vector<int32_t> targets(rows);
  for (int64_t r = 0; r < rows; ++r) targets[r] = r % 5 == 3 ? -100 : static_cast<int32_t>((r * 7919) % vocab);
  DeviceBuffer<T> dl(logits.size());
  DeviceBuffer<int32_t> dt(rows);
  DeviceBuffer<float> loss(rows);
  dt.Upload(targets);
  std::vector<float> want_loss(rows), want_grad(logits.size());
  const float scale = 1.0f / 15;
  kref::CrossEntropy(logits.data(), targets.data(), rows, vocab, scale, want_loss.data(), want_grad.data());
  // Forward only, then forward + gradient in place over the logits.
  Act<T>::Up(dl, logits);
  loss.Poison();
  LAUNCH_OK(kc::CrossEntropy<T>(dl.get(), dt.get(), rows, vocab, scale, loss.get(), nullptr, nullptr));
  ExpectClose("ce loss", loss.Download(), want_loss, 1e-5);
  loss.Poison();
  LAUNCH_OK(kc::CrossEntropy<T>(dl.get(), dt.get(), rows, vocab, scale, loss.get(), dl.get(), nullptr));
  ExpectClose("ce loss (with grad)", loss.Download(), want_loss, 1e-5);
  ExpectClose("ce dlogits (in place)", Act<T>::Down(dl), want_grad, Act<T>::kBf16 ? 1e-2 : 1e-5);
}

GPU_TEST(CrossEntropyFp32) { CrossEntropyCase<float>(); }
GPU_TEST(CrossEntropyBf16) { CrossEntropyCase<__nv_bfloat16>(); }

GPU_TEST(MultiTensorAdamW) {
  // 60 tensors (more than one launch's worth), sizes around the chunk size.
  std::vector<int64_t> sizes;
  for (int i = 0; i < 60; ++i) sizes.push_back(1 + (i * 7919) % 40000);
  struct Host {
    std::vector<float> p, g, m, v;
  };
  std::vector<Host> host;
  std::vector<std::unique_ptr<DeviceBuffer<float>>> bufs;
  std::vector<std::unique_ptr<DeviceBuffer<__nv_bfloat16>>> bf;
  std::vector<kc::AdamWTensor> tensors;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t n = sizes[i];
    Host h{RandomFloats(n, 100 + i), RandomFloats(n, 200 + i, 0.1f), RandomFloats(n, 300 + i, 0.01f),
           RandomFloats(n, 400 + i, 0.001f)};
    for (float& x : h.v) x = std::fabs(x);
    kc::AdamWTensor t;
    for (auto* vec : {&h.p, &h.g, &h.m, &h.v}) {
      bufs.push_back(std::make_unique<DeviceBuffer<float>>(n));
      bufs.back()->Upload(*vec);
    }
    const size_t base = bufs.size() - 4;
    t.param = bufs[base]->get();
    t.grad = bufs[base + 1]->get();
    t.m = bufs[base + 2]->get();
    t.v = bufs[base + 3]->get();
    bf.push_back(std::make_unique<DeviceBuffer<__nv_bfloat16>>(n));
    bf.back()->Poison();
    t.param_bf16 = i % 2 == 0 ? bf.back()->get() : nullptr;
    t.n = n;
    tensors.push_back(t);
    host.push_back(std::move(h));
  }
  kc::AdamWHyper hyper;
  hyper.lr = 3e-3f;
  hyper.weight_decay = 0.1f;
  hyper.step = 5;
  LAUNCH_OK(kc::MultiTensorAdamW(tensors, hyper, nullptr));
  std::vector<float> got_p, want_p, got_m, want_m, got_v, want_v, got_bf, want_bf;
  for (size_t i = 0; i < sizes.size(); ++i) {
    Host h = host[i];
    kref::AdamW(h.p.data(), h.g.data(), h.m.data(), h.v.data(), sizes[i], hyper.lr, hyper.beta1, hyper.beta2,
                hyper.eps, hyper.weight_decay, hyper.step);
    auto p = bufs[4 * i]->Download(), m = bufs[4 * i + 2]->Download(), v = bufs[4 * i + 3]->Download();
    got_p.insert(got_p.end(), p.begin(), p.end());
    want_p.insert(want_p.end(), h.p.begin(), h.p.end());
    got_m.insert(got_m.end(), m.begin(), m.end());
    want_m.insert(want_m.end(), h.m.begin(), h.m.end());
    got_v.insert(got_v.end(), v.begin(), v.end());
    want_v.insert(want_v.end(), h.v.begin(), h.v.end());
    if (i % 2 == 0) {
      auto b = FromBf16(bf[i]->Download());
      got_bf.insert(got_bf.end(), b.begin(), b.end());
      want_bf.insert(want_bf.end(), p.begin(), p.end());
    }
  }
  ExpectClose("adamw param", got_p, want_p, 1e-6);
  ExpectClose("adamw m", got_m, want_m, 1e-6);
  ExpectClose("adamw v", got_v, want_v, 1e-6);
  ExpectClose("adamw bf16 copy", got_bf, want_bf, 5e-3);
}

}  // namespace
}  // namespace loom::gpu_test
