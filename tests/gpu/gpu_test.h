// A tiny std-only test runner for the CUDA kernel tests: the device harness
// builds these with plain nvcc (no GoogleTest there). Where no GPU is present
// the binary prints "SKIP: <reason>" and exits 0; ctest maps that line to
// "skipped". Helpers: checked CUDA calls, device buffers that are poisoned
// (all bits set: NaN in float, bf16 and e4m3) before every run, random inputs,
// and error norms.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/hd/bf16_bits.h"

namespace loom::gpu_test {

struct TestCase {
  const char* name;
  void (*fn)();
};

inline std::vector<TestCase>& Registry() {
  static std::vector<TestCase> tests;
  return tests;
}

struct Registrar {
  Registrar(const char* name, void (*fn)()) { Registry().push_back({name, fn}); }
};

#define GPU_TEST(name)                                                        \
  static void name();                                                         \
  static ::loom::gpu_test::Registrar name##_registrar(#name, &name);          \
  static void name()

struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline std::string Where(const char* file, int line) { return std::string(file) + ":" + std::to_string(line); }

#define CUDA_OK(expr)                                                                              \
  do {                                                                                             \
    cudaError_t err_ = (expr);                                                                     \
    if (err_ != cudaSuccess)                                                                       \
      throw ::loom::gpu_test::Failure(::loom::gpu_test::Where(__FILE__, __LINE__) + ": " #expr " -> " + \
                                      cudaGetErrorString(err_));                                   \
  } while (0)

// After a launcher: its status, then the kernel's own completion.
#define LAUNCH_OK(expr)                  \
  do {                                   \
    CUDA_OK(expr);                       \
    CUDA_OK(cudaGetLastError());         \
    CUDA_OK(cudaDeviceSynchronize());    \
  } while (0)

#define CHECK(cond, msg)                                                                               \
  do {                                                                                                 \
    if (!(cond)) {                                                                                     \
      std::ostringstream os_;                                                                          \
      os_ << ::loom::gpu_test::Where(__FILE__, __LINE__) << ": CHECK(" #cond ") failed: " << msg;      \
      throw ::loom::gpu_test::Failure(os_.str());                                                      \
    }                                                                                                  \
  } while (0)

template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) { CUDA_OK(cudaMalloc(&ptr_, Bytes() > 0 ? Bytes() : 16)); }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() const { return ptr_; }
  size_t size() const { return n_; }
  size_t Bytes() const { return n_ * sizeof(T); }
  void Poison() { CUDA_OK(cudaMemset(ptr_, 0xff, Bytes())); }
  void Upload(const std::vector<T>& host) {
    CHECK(host.size() == n_, "size " << host.size() << " vs " << n_);
    CUDA_OK(cudaMemcpy(ptr_, host.data(), Bytes(), cudaMemcpyHostToDevice));
  }
  std::vector<T> Download() const {
    std::vector<T> host(n_);
    CUDA_OK(cudaMemcpy(host.data(), ptr_, Bytes(), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  T* ptr_ = nullptr;
  size_t n_;
};

// Random normal values, never exactly zero, already rounded to bf16 when
// `bf16` (so the reference sees exactly what the kernel reads).
inline std::vector<float> RandomFloats(size_t n, uint32_t seed, float stddev = 1.0f, bool bf16 = false) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) {
    do {
      x = nd(rng);
      if (bf16) x = kernels::cuda::RoundToBf16(x);
    } while (x == 0.0f);
  }
  return v;
}

inline std::vector<__nv_bfloat16> ToBf16(const std::vector<float>& v) {
  std::vector<__nv_bfloat16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    uint16_t bits = kernels::cuda::FloatToBf16Bits(v[i]);
    std::memcpy(&out[i], &bits, 2);
  }
  return out;
}

inline std::vector<float> FromBf16(const std::vector<__nv_bfloat16>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    uint16_t bits;
    std::memcpy(&bits, &v[i], 2);
    out[i] = kernels::cuda::Bf16BitsToFloat(bits);
  }
  return out;
}

// ||got - want|| / ||want||; a NaN or inf anywhere in got fails the caller's
// comparison (returns inf).
inline double RelativeError(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(num / (den > 0 ? den : 1e-300));
}

inline void ExpectClose(const char* what, const std::vector<float>& got, const std::vector<float>& want,
                        double rel_tol) {
  CHECK(got.size() == want.size(), what << ": size " << got.size() << " vs " << want.size());
  double err = RelativeError(got, want);
  std::printf("    %-28s rel err %.3e (tol %.1e)\n", what, err, rel_tol);
  CHECK(err <= rel_tol, what << ": relative error " << err << " > " << rel_tol);
}

inline int RunAll(int argc, char** argv) {
  int devices = 0;
  cudaError_t err = cudaGetDeviceCount(&devices);
  if (err != cudaSuccess || devices == 0) {
    std::printf("SKIP: no CUDA device (cudaGetDeviceCount: %s, %d devices); %zu GPU tests not run\n",
                err == cudaSuccess ? "ok" : cudaGetErrorString(err), devices, Registry().size());
    return 0;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
    std::printf("device: %s, sm_%d%d, %d SMs\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
  if (prop.major != 9) {
    std::printf("SKIP: kernels are built for sm_90a; device is sm_%d%d\n", prop.major, prop.minor);
    return 0;
  }
  const char* filter = argc > 1 ? argv[1] : nullptr;
  int failed = 0, run = 0;
  for (const TestCase& t : Registry()) {
    if (filter && std::strstr(t.name, filter) == nullptr) continue;
    ++run;
    std::printf("[ RUN  ] %s\n", t.name);
    std::fflush(stdout);
    try {
      t.fn();
      std::printf("[  OK  ] %s\n", t.name);
    } catch (const std::exception& e) {
      ++failed;
      std::printf("[ FAIL ] %s\n    %s\n", t.name, e.what());
      // A sticky error poisons the context: later tests would fail for it.
      if (cudaGetLastError() != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) {
        std::printf("sticky CUDA error; stopping\n");
        break;
      }
    }
    std::fflush(stdout);
  }
  std::printf("%d of %d GPU tests passed\n", run - failed, run);
  return failed == 0 ? 0 : 1;
}

}  // namespace loom::gpu_test
