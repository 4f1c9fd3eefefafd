// The peak table: nvidia-smi names map to the right device (specific models
// before general ones, whole words only), every dtype reads its own column,
// and an unknown device or a missing unit is nullopt, never a guess.
#include "common/hardware/device_peaks.h"

#include <set>
#include <string>

#include "gtest/gtest.h"

namespace loom::hardware {
namespace {

std::string IdOf(std::string_view smi_name) {
  const DeviceSpec* device = FindDevice(smi_name);
  return device == nullptr ? "<none>" : std::string(device->id);
}

TEST(FindDeviceTest, NamesAsNvidiaSmiPrintsThem) {
  EXPECT_EQ(IdOf("NVIDIA H100 80GB HBM3"), "h100-sxm");
  EXPECT_EQ(IdOf("NVIDIA H100 SXM5 80GB"), "h100-sxm");
  EXPECT_EQ(IdOf("NVIDIA H100 PCIe"), "h100-pcie");
  EXPECT_EQ(IdOf("NVIDIA H100 NVL"), "h100-nvl");
  EXPECT_EQ(IdOf("NVIDIA H200"), "h200");
  EXPECT_EQ(IdOf("NVIDIA H200 NVL"), "h200-nvl");
  EXPECT_EQ(IdOf("NVIDIA GH200 480GB"), "gh200");
  EXPECT_EQ(IdOf("NVIDIA A100-SXM4-80GB"), "a100-sxm4-80gb");
  EXPECT_EQ(IdOf("NVIDIA A100-SXM4-40GB"), "a100-sxm4-40gb");
  EXPECT_EQ(IdOf("NVIDIA A100 80GB PCIe"), "a100-pcie-80gb");
  EXPECT_EQ(IdOf("NVIDIA A100-PCIE-40GB"), "a100-pcie-40gb");
  EXPECT_EQ(IdOf("NVIDIA L40S"), "l40s");
  EXPECT_EQ(IdOf("NVIDIA L40"), "l40");
  EXPECT_EQ(IdOf("NVIDIA L4"), "l4");
  EXPECT_EQ(IdOf("NVIDIA A10"), "a10");
  EXPECT_EQ(IdOf("NVIDIA B200"), "b200");
}

TEST(FindDeviceTest, CaseSpacingAndPrefixDoNotMatter) {
  EXPECT_EQ(IdOf("  nvidia   h100_pcie "), "h100-pcie");
  EXPECT_EQ(IdOf("H200"), "h200");
  EXPECT_EQ(IdOf("Tesla A100-SXM4-80GB"), "a100-sxm4-80gb");
  EXPECT_EQ(IdOf("a100 80gb pcie"), "a100-pcie-80gb");
}

TEST(FindDeviceTest, WholeWordsOnly) {
  // Other products whose names contain a known one as a substring.
  EXPECT_EQ(FindDevice("NVIDIA H20"), nullptr);       // not an H200
  EXPECT_EQ(FindDevice("NVIDIA A10G"), nullptr);      // not an A10
  EXPECT_EQ(FindDevice("NVIDIA A1000"), nullptr);     // not an A100
  EXPECT_EQ(FindDevice("NVIDIA GeForce RTX 4090"), nullptr);
  EXPECT_EQ(FindDevice("Some Future GPU"), nullptr);
  EXPECT_EQ(FindDevice(""), nullptr);
  EXPECT_EQ(FindDevice("NVIDIA"), nullptr);
}

TEST(DensePeakFlopsTest, EveryDtypeOfTheHoppersAndA100) {
  for (const char* name : {"NVIDIA H100 80GB HBM3", "NVIDIA H200"}) {
    EXPECT_DOUBLE_EQ(*DensePeakFlops(name, Dtype::kFp32), 67e12) << name;
    EXPECT_DOUBLE_EQ(*DensePeakFlops(name, Dtype::kTf32), 494.5e12) << name;
    EXPECT_DOUBLE_EQ(*DensePeakFlops(name, Dtype::kBf16), 989.5e12) << name;
    EXPECT_DOUBLE_EQ(*DensePeakFlops(name, Dtype::kFp8), 1979e12) << name;
  }
  EXPECT_DOUBLE_EQ(*DensePeakFlops("NVIDIA H100 PCIe", Dtype::kBf16), 756e12);
  EXPECT_DOUBLE_EQ(*DensePeakFlops("NVIDIA H100 PCIe", Dtype::kFp8), 1513e12);
  const char* a100 = "NVIDIA A100-SXM4-80GB";
  EXPECT_DOUBLE_EQ(*DensePeakFlops(a100, Dtype::kFp32), 19.5e12);
  EXPECT_DOUBLE_EQ(*DensePeakFlops(a100, Dtype::kTf32), 156e12);
  EXPECT_DOUBLE_EQ(*DensePeakFlops(a100, Dtype::kBf16), 312e12);
  // Ampere has no fp8 units: no number, and the device is still known.
  EXPECT_FALSE(DensePeakFlops(a100, Dtype::kFp8).has_value());
  ASSERT_NE(FindDevice(a100), nullptr);
  EXPECT_EQ(FindDevice(a100)->PeakFlops(Dtype::kFp8), 0);
}

TEST(DensePeakFlopsTest, UnknownDeviceIsNulloptForEveryDtype) {
  for (Dtype dtype : kAllDtypes) {
    EXPECT_FALSE(DensePeakFlops("Some Future GPU", dtype).has_value()) << DtypeName(dtype);
  }
}

TEST(DeviceTableTest, RowsAreConsistent) {
  std::set<std::string_view> ids;
  for (const DeviceSpec& d : AllDevices()) {
    EXPECT_TRUE(ids.insert(d.id).second) << "duplicate id " << d.id;
    // Each row's own nvidia-smi name finds that row (the order is right).
    EXPECT_EQ(IdOf(d.smi_name), d.id);
    EXPECT_EQ(DeviceById(d.id), &d);
    // Every device has fp32 and bf16 units; each halving of the input width
    // doubles the tensor-core rate (to the datasheets' rounding, within 3%).
    EXPECT_GT(d.fp32, 0) << d.id;
    EXPECT_GE(d.tf32, d.fp32) << d.id;
    EXPECT_NEAR(d.bf16, 2 * d.tf32, 0.03 * d.bf16) << d.id;
    if (d.fp8 > 0) {
      EXPECT_NEAR(d.fp8, 2 * d.bf16, 0.03 * d.fp8) << d.id;
    }
    EXPECT_GE(d.memory_bytes, 0) << d.id;
  }
  EXPECT_EQ(DeviceById("no-such-device"), nullptr);
}

TEST(DeviceTableTest, PresetDevicesCarryMemoryAndBandwidths) {
  for (const char* id : {"h100-sxm", "h200", "a100-sxm4-80gb"}) {
    const DeviceSpec* d = DeviceById(id);
    ASSERT_NE(d, nullptr) << id;
    EXPECT_GT(d->memory_bytes, 70.0 * (1 << 30)) << id;
    EXPECT_GT(d->hbm_bandwidth, 1e12) << id;
    EXPECT_GT(d->nvlink_bandwidth, 1e11) << id;
  }
  EXPECT_GT(DeviceById("h200")->memory_bytes, DeviceById("h100-sxm")->memory_bytes);
  EXPECT_GT(DeviceById("h200")->hbm_bandwidth, DeviceById("h100-sxm")->hbm_bandwidth);
}

TEST(DtypeTest, NamesRoundTrip) {
  for (Dtype dtype : kAllDtypes) EXPECT_EQ(ParseDtype(DtypeName(dtype)), dtype);
  EXPECT_FALSE(ParseDtype("fp16").has_value());
  EXPECT_FALSE(ParseDtype("BF16").has_value());
}

}  // namespace
}  // namespace loom::hardware
