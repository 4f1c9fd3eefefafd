#include "worker/agent/device_probe.h"

#include <cblas.h>
#include <sched.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/hardware/device_peaks.h"

namespace loom::agent {

absl::StatusOr<DeviceRequest> ParseDevicesFlag(const std::string& value) {
  DeviceRequest request;
  if (value == "gpu") {
    request.kind = DeviceRequest::Kind::kGpu;
    return request;
  }
  std::string count_text;
  if (value.rfind("cpu:", 0) == 0) count_text = value.substr(4);
  int count = 0;
  if (count_text.empty() || !std::all_of(count_text.begin(), count_text.end(),
                                         [](unsigned char c) { return std::isdigit(c); }) ||
      !absl::SimpleAtoi(count_text, &count) || count < 1 || count > 4096) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--devices=", value, " must be cpu:N (N a whole number from 1 to 4096) or gpu"));
  }
  request.kind = DeviceRequest::Kind::kCpu;
  request.cpu_count = count;
  return request;
}

absl::StatusOr<std::vector<GpuInfo>> ParseNvidiaSmiCsv(const std::string& text) {
  std::vector<GpuInfo> gpus;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipWhitespace())) {
    std::vector<std::string> fields = absl::StrSplit(line, ',');
    if (fields.size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("nvidia-smi line '", std::string(line), "' is not 'name, memory'"));
    }
    GpuInfo gpu;
    gpu.name = std::string(absl::StripAsciiWhitespace(fields[0]));
    absl::string_view memory = absl::StripAsciiWhitespace(fields[1]);
    absl::ConsumeSuffix(&memory, "MiB");
    memory = absl::StripAsciiWhitespace(memory);
    int64_t mib = 0;
    if (gpu.name.empty() || !absl::SimpleAtoi(memory, &mib) || mib < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("nvidia-smi line '", std::string(line), "' has no GPU name or MiB count"));
    }
    gpu.memory_bytes = mib * 1024 * 1024;
    gpus.push_back(std::move(gpu));
  }
  return gpus;
}

double GpuPeakFlops(const std::string& name) {
  return hardware::DensePeakFlops(name, hardware::Dtype::kBf16).value_or(0);
}

std::vector<DeviceInfo> GroupGpus(const std::vector<GpuInfo>& gpus) {
  std::vector<DeviceInfo> devices;
  for (const GpuInfo& gpu : gpus) {
    auto it = std::find_if(devices.begin(), devices.end(),
                           [&](const DeviceInfo& d) { return d.name == gpu.name; });
    if (it == devices.end()) {
      devices.push_back({"gpu", 1, gpu.name, gpu.memory_bytes, GpuPeakFlops(gpu.name)});
    } else {
      ++it->count;
      it->memory_bytes = std::min(it->memory_bytes, gpu.memory_bytes);
    }
  }
  return devices;
}

int UsableCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
}

int64_t HostMemoryBytes() {
  return static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
}

std::string CpuModelName() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      size_t colon = line.find(':');
      if (colon != std::string::npos) {
        return std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
      }
    }
  }
  return "cpu";
}

int ThreadsPerRank(int cores, int ranks) { return std::max(1, cores / std::max(1, ranks)); }

double MeasureCpuFlops(int threads, absl::Duration budget) {
  constexpr int kN = 512;
  std::vector<float> a(kN * kN), b(kN * kN), c(kN * kN, 0.0f);
  for (int i = 0; i < kN * kN; ++i) {
    a[i] = static_cast<float>((i % 13) - 6) / 8.0f;
    b[i] = static_cast<float>((i % 7) - 3) / 4.0f;
  }
  openblas_set_num_threads(std::max(1, threads));
  auto run = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, kN, kN, kN, 1.0f, a.data(), kN,
                b.data(), kN, 0.0f, c.data(), kN);
  };
  run();  // warm-up: thread pool start, page faults
  const double flops_per_call = 2.0 * kN * kN * kN;
  double best = 0;
  auto start = std::chrono::steady_clock::now();
  auto limit = start + absl::ToChronoNanoseconds(budget);
  for (int i = 0; i < 1000; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    run();
    auto t1 = std::chrono::steady_clock::now();
    double seconds = std::chrono::duration<double>(t1 - t0).count();
    if (seconds > 0) best = std::max(best, flops_per_call / seconds);
    if (t1 >= limit) break;
  }
  return best;
}

std::vector<GpuInfo> DetectGpus() {
  bool found = false;
  const char* path = getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path != nullptr ? path : "", ':')) {
    if (!dir.empty() &&
        access(absl::StrCat(std::string(dir), "/nvidia-smi").c_str(), X_OK) == 0) {
      found = true;
      break;
    }
  }
  if (!found) return {};
  FILE* pipe = popen(
      "nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits 2>/dev/null", "r");
  if (pipe == nullptr) return {};
  std::string output;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, n);
  if (pclose(pipe) != 0) return {};
  absl::StatusOr<std::vector<GpuInfo>> gpus = ParseNvidiaSmiCsv(output);
  return gpus.ok() ? *gpus : std::vector<GpuInfo>{};
}

absl::StatusOr<std::vector<DeviceInfo>> ProbeDevices(const DeviceRequest& request) {
  if (request.kind == DeviceRequest::Kind::kGpu) {
    std::vector<GpuInfo> gpus = DetectGpus();
    if (gpus.empty()) {
      return absl::FailedPreconditionError(
          "--devices=gpu but no GPU was found (nvidia-smi is not on PATH or lists none); "
          "run with --devices=cpu:N on a machine without GPUs");
    }
    return GroupGpus(gpus);
  }
  DeviceInfo cpu;
  cpu.kind = "cpu";
  cpu.count = request.cpu_count;
  cpu.name = CpuModelName();
  cpu.memory_bytes = HostMemoryBytes() / request.cpu_count;
  cpu.peak_flops = MeasureCpuFlops(ThreadsPerRank(UsableCores(), request.cpu_count));
  return std::vector<DeviceInfo>{cpu};
}

}  // namespace loom::agent
