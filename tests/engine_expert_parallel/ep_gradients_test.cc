// Gradients under EP: after the DP reduction the dense gradients are summed
// over the EP group (one all-reduce per contiguous run of dense tensors), the
// experts' are not; the norm over the EP group counts the replicated dense
// tensors once and every rank's experts.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "tests/comm/rank_harness.h"
#include "worker/comm/in_process_store.h"
#include "worker/engine/expert_parallel/ep_gradients.h"

namespace loom::engine {
namespace {

// One flat array: embedding [2,3], expert [2,2], router [1,2], norm [3]. The
// expert splits the dense tensors into two runs.
std::vector<TensorView> Views(float* flat, int rank) {
  return {{"model.embed_tokens.weight", {2, 3}, flat},
          {"model.layers.0.mlp.experts." + std::to_string(rank) + ".gate_proj.weight", {2, 2}, flat + 6},
          {"model.layers.0.mlp.gate.weight", {1, 2}, flat + 10},
          {"model.norm.weight", {3}, flat + 12}};
}

TEST(EpGradientsTest, ExpertOrDense) {
  EXPECT_TRUE(IsExpertParameter("model.layers.3.mlp.experts.17.down_proj.weight"));
  EXPECT_FALSE(IsExpertParameter("model.layers.3.mlp.shared_experts.down_proj.weight"));
  EXPECT_FALSE(IsExpertParameter("model.layers.3.mlp.gate.weight"));
  EXPECT_FALSE(IsExpertParameter("model.layers.0.mlp.down_proj.weight"));
}

TEST(EpGradientsTest, DenseSummedOverEpExpertsKeptNormCountsEachOnce) {
  constexpr int kRanks = 2;
  comm::InProcessStore store;
  auto comms = comm::testing::MakeGroup(store, kRanks, absl::Seconds(30), "ep");
  std::vector<std::vector<float>> flats(kRanks, std::vector<float>(15));
  for (int r = 0; r < kRanks; ++r) {
    for (int i = 0; i < 15; ++i) flats[r][i] = static_cast<float>(i + 1) * (r == 0 ? 1.0f : -0.5f);
  }
  const std::vector<std::vector<float>> before = flats;
  std::vector<double> norms(kRanks);
  comm::testing::RunRanks(comms, [&](int r, comm::Communicator& ep) {
    auto ops = kernels::cpu::MakeCpuOps(1);
    const std::vector<TensorView> grads = Views(flats[r].data(), r);
    ASSERT_TRUE(ReduceDenseGradientsOverEp(*ops, &ep, grads).ok());
    const comm::OpCounters c = ep.Stats().at("all_reduce");
    EXPECT_EQ(c.calls, 2);  // [embedding], [router, norm]
    EXPECT_EQ(c.logical_bytes, (15 - 4) * 4);
    auto norm = GlobalGradientNorm(*ops, EpGradientPieces(grads, kRanks), {&ep});
    ASSERT_TRUE(norm.ok());
    norms[r] = *norm;
  });
  double want = 0;
  for (int i = 0; i < 15; ++i) {
    const bool expert = i >= 6 && i < 10;
    for (int r = 0; r < kRanks; ++r) {
      const float got = flats[r][i];
      const float sum = before[0][i] + before[1][i];
      EXPECT_EQ(got, expert ? before[r][i] : sum) << "rank " << r << " element " << i;
    }
    if (expert) {
      want += double{before[0][i]} * before[0][i] + double{before[1][i]} * before[1][i];
    } else {
      const double sum = double{before[0][i]} + before[1][i];
      want += sum * sum;
    }
  }
  for (int r = 0; r < kRanks; ++r) EXPECT_NEAR(norms[r], std::sqrt(want), 1e-5 * std::sqrt(want));
}

TEST(EpGradientsTest, WithoutAnEpGroupNothingMoves) {
  auto ops = kernels::cpu::MakeCpuOps(1);
  std::vector<float> flat(15, 2.0f);
  ASSERT_TRUE(ReduceDenseGradientsOverEp(*ops, nullptr, Views(flat.data(), 0)).ok());
  EXPECT_EQ(flat, std::vector<float>(15, 2.0f));
  for (const GradientPiece& p : EpGradientPieces(Views(flat.data(), 0), 1)) EXPECT_EQ(p.replicas, 1);
}

}  // namespace
}  // namespace loom::engine
