#include "coordinator/jobs/rank_peak.h"

#include <gtest/gtest.h>

namespace loom::coordinator {
namespace {

NodeInfo Node(const std::string& kind, const std::string& name, double reported) {
  NodeInfo node;
  node.device_kind = kind;
  node.device_name = name;
  node.peak_flops_per_device = reported;
  return node;
}

TEST(RankPeakTest, GpuPeakFollowsThePrecisionsDtype) {
  const NodeInfo h200 = Node("gpu", "NVIDIA H200", 989.5e12);
  EXPECT_DOUBLE_EQ(RankPeakFlops(h200, spec::Precision::kBf16), 989.5e12);
  EXPECT_DOUBLE_EQ(RankPeakFlops(h200, spec::Precision::kFp8), 1979e12);
  EXPECT_DOUBLE_EQ(RankPeakFlops(h200, spec::Precision::kFp32), 67e12);
}

TEST(RankPeakTest, WhatTheTableCannotAnswerFallsBackToTheReportedPeak) {
  // A100 has no fp8 units; an unknown GPU has no row; a CPU's peak is measured.
  EXPECT_DOUBLE_EQ(RankPeakFlops(Node("gpu", "NVIDIA A100-SXM4-80GB", 312e12), spec::Precision::kFp8),
                   312e12);
  EXPECT_DOUBLE_EQ(RankPeakFlops(Node("gpu", "Some Future GPU", 5e14), spec::Precision::kBf16), 5e14);
  EXPECT_DOUBLE_EQ(RankPeakFlops(Node("cpu", "", 1.5e11), spec::Precision::kBf16), 1.5e11);
}

}  // namespace
}  // namespace loom::coordinator
