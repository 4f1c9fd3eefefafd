// Parsing of --devices and of nvidia-smi output, GPU grouping, per-rank
// threads, and a sanity check of the CPU FLOP/s measurement.
#include "worker/agent/device_probe.h"

#include "gtest/gtest.h"

namespace loom::agent {
namespace {

TEST(ParseDevicesFlagTest, AcceptsCpuCountAndGpu) {
  absl::StatusOr<DeviceRequest> cpu = ParseDevicesFlag("cpu:4");
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(cpu->kind, DeviceRequest::Kind::kCpu);
  EXPECT_EQ(cpu->cpu_count, 4);
  absl::StatusOr<DeviceRequest> gpu = ParseDevicesFlag("gpu");
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_EQ(gpu->kind, DeviceRequest::Kind::kGpu);
}

TEST(ParseDevicesFlagTest, RejectsEverythingElseNamingTheFlag) {
  for (const char* bad : {"", "cpu", "cpu:", "cpu:0", "cpu:-1", "cpu:2x", "cpu: 2", "tpu", "gpu:2",
                          "CPU:2", "cpu:99999"}) {
    absl::StatusOr<DeviceRequest> parsed = ParseDevicesFlag(bad);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(parsed.status().message().find("--devices="), absl::string_view::npos) << bad;
  }
}

TEST(ParseNvidiaSmiCsvTest, ParsesWithAndWithoutUnits) {
  absl::StatusOr<std::vector<GpuInfo>> gpus =
      ParseNvidiaSmiCsv("NVIDIA H100 80GB HBM3, 81559 MiB\nNVIDIA H100 80GB HBM3, 81559\n\n");
  ASSERT_TRUE(gpus.ok()) << gpus.status();
  ASSERT_EQ(gpus->size(), 2u);
  EXPECT_EQ((*gpus)[0].name, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ((*gpus)[0].memory_bytes, int64_t{81559} * 1024 * 1024);
  EXPECT_EQ((*gpus)[1].memory_bytes, int64_t{81559} * 1024 * 1024);
  EXPECT_TRUE(ParseNvidiaSmiCsv("").ok());
  EXPECT_FALSE(ParseNvidiaSmiCsv("no comma here").ok());
  EXPECT_FALSE(ParseNvidiaSmiCsv("NVIDIA A100, lots MiB").ok());
}

TEST(GroupGpusTest, FoldsSameModelAndLooksUpPeak) {
  std::vector<DeviceInfo> devices = GroupGpus({{"NVIDIA H200", 100}, {"NVIDIA H200", 90},
                                               {"NVIDIA A100-SXM4-80GB", 80}});
  ASSERT_EQ(devices.size(), 2u);
  EXPECT_EQ(devices[0].kind, "gpu");
  EXPECT_EQ(devices[0].count, 2);
  EXPECT_EQ(devices[0].memory_bytes, 90);  // the smaller one: what every rank can count on
  EXPECT_DOUBLE_EQ(devices[0].peak_flops, 989.5e12);
  EXPECT_EQ(devices[1].count, 1);
  EXPECT_DOUBLE_EQ(devices[1].peak_flops, 312e12);
}

// The agent registers the shared table's dense bf16 peak (tests/hardware
// covers the table itself); an unknown model registers 0.
TEST(GpuPeakFlopsTest, ReadsTheSharedTablesBf16Column) {
  EXPECT_DOUBLE_EQ(GpuPeakFlops("NVIDIA H100 PCIe"), 756e12);
  EXPECT_DOUBLE_EQ(GpuPeakFlops("NVIDIA H100 80GB HBM3"), 989.5e12);
  EXPECT_DOUBLE_EQ(GpuPeakFlops("NVIDIA H200"), 989.5e12);
  EXPECT_DOUBLE_EQ(GpuPeakFlops("NVIDIA L40S"), 362.05e12);
  EXPECT_DOUBLE_EQ(GpuPeakFlops("NVIDIA H20"), 0);
  EXPECT_DOUBLE_EQ(GpuPeakFlops("Some Future GPU"), 0);
}

TEST(ThreadsPerRankTest, SplitsCoresAtLeastOne) {
  EXPECT_EQ(ThreadsPerRank(16, 4), 4);
  EXPECT_EQ(ThreadsPerRank(16, 3), 5);
  EXPECT_EQ(ThreadsPerRank(2, 4), 1);
  EXPECT_EQ(ThreadsPerRank(8, 0), 8);
}

TEST(HostProbeTest, ReportsSomething) {
  EXPECT_GE(UsableCores(), 1);
  EXPECT_GT(HostMemoryBytes(), 0);
  EXPECT_FALSE(CpuModelName().empty());
  // One sgemm is at least a few MFLOP/s on anything that runs this test.
  EXPECT_GT(MeasureCpuFlops(1, absl::Milliseconds(20)), 1e6);
}

TEST(ProbeDevicesTest, CpuDevicesShareHostMemory) {
  DeviceRequest request;
  request.cpu_count = 2;
  absl::StatusOr<std::vector<DeviceInfo>> devices = ProbeDevices(request);
  ASSERT_TRUE(devices.ok()) << devices.status();
  ASSERT_EQ(devices->size(), 1u);
  EXPECT_EQ((*devices)[0].kind, "cpu");
  EXPECT_EQ((*devices)[0].count, 2);
  EXPECT_EQ((*devices)[0].memory_bytes, HostMemoryBytes() / 2);
  EXPECT_GT((*devices)[0].peak_flops, 0);
}

}  // namespace
}  // namespace loom::agent
