// The expert-parallel dispatcher against one process. Each rank routes its
// own tokens to top-k of E experts (random, some experts starved), lays the
// rows out in permuted order as the MoE layer does, dispatches them to the
// ranks holding the experts, runs each expert (a linear map, through the
// backend's GEMM) on its grouped rows, combines, and weights the k outputs.
// Outputs, input gradients and expert-weight gradients must equal a
// one-process reference over all ranks' tokens; the byte counters must equal
// the rows the counts say moved.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "tests/comm/rank_harness.h"
#include "worker/comm/in_process_store.h"
#include "worker/comm/self_communicator.h"
#include "worker/engine/expert_parallel/ep_exchange.h"

namespace loom::engine {
namespace {

constexpr int64_t kExperts = 8, kTopK = 2, kWidth = 6, kFloat = 4;

// One rank's tokens and routing, and the loss weights g (loss = sum out * g).
struct RankData {
  int64_t tokens = 0;
  std::vector<float> x;       // [tokens, width]
  std::vector<int32_t> ids;   // [tokens * k], distinct per token, < 0: dropped
  std::vector<float> w;       // [tokens * k]
  std::vector<float> g;       // [tokens, width]
};

RankData MakeRank(int rank, int64_t tokens) {
  std::mt19937 rng(1234 + rank);
  std::uniform_real_distribution<float> u(-1, 1);
  RankData d;
  d.tokens = tokens;
  for (int64_t i = 0; i < tokens * kWidth; ++i) d.x.push_back(u(rng)), d.g.push_back(u(rng));
  for (int64_t t = 0; t < tokens; ++t) {
    // Expert 5 is never chosen (an empty block everywhere); rank 1's tokens
    // avoid experts 0..3 (a rank that sends nothing to rank 0 under ep 2).
    std::vector<int32_t> pool;
    for (int32_t e = 0; e < kExperts; ++e) {
      if (e != 5 && !(rank == 1 && e < 4)) pool.push_back(e);
    }
    std::shuffle(pool.begin(), pool.end(), rng);
    for (int j = 0; j < kTopK; ++j) {
      // Every seventh assignment is dropped, as a capacity would.
      d.ids.push_back((t * kTopK + j) % 7 == 3 ? -1 : pool[j]);
      d.w.push_back(0.25f + 0.5f * static_cast<float>(j));
    }
  }
  return d;
}

std::vector<float> ExpertWeights() {  // [E, width, width], expert e: y = x W_e^T
  std::mt19937 rng(99);
  std::uniform_real_distribution<float> u(-0.5, 0.5);
  std::vector<float> w(kExperts * kWidth * kWidth);
  for (float& v : w) v = u(rng);
  return w;
}

struct RankResult {
  std::vector<float> out;    // [tokens, width]
  std::vector<float> d_x;    // [tokens, width]
  std::vector<float> d_w;    // [held, width, width]
  comm::CommStats stats;
  std::vector<int64_t> send_rows, recv_rows;  // per EP rank
};

// What the MoE layer does around the exchange, on one rank.
RankResult RunRank(const RankData& d, const std::vector<float>& weights, comm::Communicator* ep) {
  auto ops = kernels::cpu::MakeCpuOps(1);
  auto made = EpExpertExchange::Create(ep, ops.get(), kExperts);
  EXPECT_TRUE(made.ok()) << made.status();
  EpExpertExchange& ex = **made;
  const int64_t held = ex.num_held(), first = ex.first_expert();

  // Permuted order: kept assignments sorted by expert, each in assignment order.
  std::vector<int64_t> counts(kExperts, 0);
  std::vector<int32_t> assignment_of, row_of(d.ids.size(), -1);
  for (int32_t e = 0; e < kExperts; ++e) {
    for (size_t a = 0; a < d.ids.size(); ++a) {
      if (d.ids[a] != e) continue;
      row_of[a] = static_cast<int32_t>(assignment_of.size());
      assignment_of.push_back(static_cast<int32_t>(a));
      ++counts[e];
    }
  }
  const int64_t rows = static_cast<int64_t>(assignment_of.size());
  std::vector<float> permuted(rows * kWidth);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = assignment_of[r] / kTopK;
    std::copy_n(d.x.begin() + t * kWidth, kWidth, permuted.begin() + r * kWidth);
  }

  ExchangePlan plan;
  EXPECT_TRUE(ex.Plan(counts, &plan).ok());
  const int64_t grouped_rows = plan.grouped_rows;
  std::vector<float> x_g(grouped_rows * kWidth), y_g(grouped_rows * kWidth);
  EXPECT_TRUE(ex.Dispatch(plan, permuted.data(), kWidth, x_g.data()).ok());
  int64_t at = 0;
  for (int64_t i = 0; i < held; ++i) {
    const float* w = weights.data() + (first + i) * kWidth * kWidth;
    const int64_t n = plan.local_counts[i];
    if (n > 0) {
      ops->Gemm(kernels::Transpose::kNo, kernels::Transpose::kYes, n, kWidth, kWidth, 1.0f,
                x_g.data() + at * kWidth, kWidth, w, kWidth, 0.0f, y_g.data() + at * kWidth, kWidth);
    }
    at += n;
  }
  EXPECT_EQ(at, grouped_rows);
  std::vector<float> y_perm(rows * kWidth);
  EXPECT_TRUE(ex.Combine(plan, y_g.data(), kWidth, y_perm.data()).ok());

  RankResult res;
  res.out.assign(d.tokens * kWidth, 0.0f);
  for (size_t a = 0; a < d.ids.size(); ++a) {
    if (row_of[a] < 0) continue;
    const int64_t t = static_cast<int64_t>(a) / kTopK;
    for (int64_t c = 0; c < kWidth; ++c) res.out[t * kWidth + c] += d.w[a] * y_perm[row_of[a] * kWidth + c];
  }

  // Backward of loss = sum(out * g).
  std::vector<float> dy_perm(rows * kWidth);
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t a = assignment_of[r];
    for (int64_t c = 0; c < kWidth; ++c) dy_perm[r * kWidth + c] = d.w[a] * d.g[(a / kTopK) * kWidth + c];
  }
  std::vector<float> dy_g(grouped_rows * kWidth), dx_g(grouped_rows * kWidth);
  EXPECT_TRUE(ex.CombineBackward(plan, dy_perm.data(), kWidth, dy_g.data()).ok());
  res.d_w.assign(held * kWidth * kWidth, 0.0f);
  at = 0;
  for (int64_t i = 0; i < held; ++i) {
    const float* w = weights.data() + (first + i) * kWidth * kWidth;
    const int64_t n = plan.local_counts[i];
    if (n > 0) {
      ops->Gemm(kernels::Transpose::kYes, kernels::Transpose::kNo, kWidth, kWidth, n, 1.0f,
                dy_g.data() + at * kWidth, kWidth, x_g.data() + at * kWidth, kWidth, 1.0f,
                res.d_w.data() + i * kWidth * kWidth, kWidth);
      ops->Gemm(kernels::Transpose::kNo, kernels::Transpose::kNo, n, kWidth, kWidth, 1.0f,
                dy_g.data() + at * kWidth, kWidth, w, kWidth, 0.0f, dx_g.data() + at * kWidth, kWidth);
    }
    at += n;
  }
  std::vector<float> dx_perm(rows * kWidth);
  EXPECT_TRUE(ex.DispatchBackward(plan, dx_g.data(), kWidth, dx_perm.data()).ok());
  res.d_x.assign(d.tokens * kWidth, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = assignment_of[r] / kTopK;
    for (int64_t c = 0; c < kWidth; ++c) res.d_x[t * kWidth + c] += dx_perm[r * kWidth + c];
  }
  if (ep != nullptr) res.stats = ep->Stats();
  const int ranks = ex.ep_size();
  res.send_rows.assign(ranks, 0);
  res.recv_rows.assign(ranks, 0);
  for (int64_t e = 0; e < kExperts; ++e) res.send_rows[e / held] += counts[e];
  for (int s = 0; s < ranks; ++s) {
    for (int64_t i = 0; i < held; ++i) res.recv_rows[s] += plan.detail[s * held + i];
  }
  return res;
}

// The definition, in double, over every rank's tokens at once.
struct Reference {
  std::vector<std::vector<double>> out, d_x;  // per rank
  std::vector<double> d_w;                    // [E, width, width]
};

Reference Compute(const std::vector<RankData>& data, const std::vector<float>& weights) {
  Reference ref;
  ref.d_w.assign(weights.size(), 0.0);
  for (const RankData& d : data) {
    std::vector<double> out(d.tokens * kWidth, 0.0), d_x(d.tokens * kWidth, 0.0);
    for (int64_t t = 0; t < d.tokens; ++t) {
      for (int j = 0; j < kTopK; ++j) {
        const int32_t e = d.ids[t * kTopK + j];
        if (e < 0) continue;
        const double w = d.w[t * kTopK + j];
        const float* W = weights.data() + e * kWidth * kWidth;
        for (int64_t o = 0; o < kWidth; ++o) {
          double y = 0;
          for (int64_t i = 0; i < kWidth; ++i) y += double{W[o * kWidth + i]} * d.x[t * kWidth + i];
          out[t * kWidth + o] += w * y;
          const double dy = w * d.g[t * kWidth + o];
          for (int64_t i = 0; i < kWidth; ++i) {
            ref.d_w[e * kWidth * kWidth + o * kWidth + i] += dy * d.x[t * kWidth + i];
            d_x[t * kWidth + i] += dy * W[o * kWidth + i];
          }
        }
      }
    }
    ref.out.push_back(out);
    ref.d_x.push_back(d_x);
  }
  return ref;
}

void ExpectNear(const std::vector<float>& got, const std::vector<double>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5) << what << " [" << i << "]";
}

class EpExchangeTest : public ::testing::TestWithParam<int> {};

TEST_P(EpExchangeTest, DispatchComputeCombineEqualsOneProcessWithGradientsAndCounters) {
  const int ranks = GetParam();
  const std::vector<float> weights = ExpertWeights();
  std::vector<RankData> data;
  for (int r = 0; r < ranks; ++r) data.push_back(MakeRank(r, r == ranks - 1 ? 3 : 9 + 2 * r));
  const Reference ref = Compute(data, weights);

  comm::InProcessStore store;
  auto comms = comm::testing::MakeGroup(store, ranks, absl::Seconds(30), "ep");
  std::vector<RankResult> results(ranks);
  comm::testing::RunRanks(comms, [&](int r, comm::Communicator& ep) { results[r] = RunRank(data[r], weights, &ep); });

  const int64_t held = kExperts / ranks;
  for (int r = 0; r < ranks; ++r) {
    const RankResult& res = results[r];
    ExpectNear(res.out, ref.out[r], "out of rank " + std::to_string(r));
    ExpectNear(res.d_x, ref.d_x[r], "d_x of rank " + std::to_string(r));
    ExpectNear(res.d_w,
               std::vector<double>(ref.d_w.begin() + r * held * kWidth * kWidth,
                                   ref.d_w.begin() + (r + 1) * held * kWidth * kWidth),
               "d_w of rank " + std::to_string(r));
    // What each rank sends is what its peer receives.
    for (int s = 0; s < ranks; ++s) EXPECT_EQ(res.recv_rows[s], results[s].send_rows[r]);
    // Four row all-to-alls (dispatch, combine and their backwards), one of counts.
    int64_t sent_away = 0, received_away = 0;
    for (int s = 0; s < ranks; ++s) {
      if (s == r) continue;
      sent_away += res.send_rows[s];
      received_away += res.recv_rows[s];
    }
    const comm::OpCounters rows = res.stats.at("all_to_all");
    EXPECT_EQ(rows.calls, 4);
    EXPECT_EQ(rows.bytes, 2 * (sent_away + received_away) * kWidth * kFloat) << "rank " << r;
    const comm::OpCounters ints = res.stats.at("all_to_all_int64");
    EXPECT_EQ(ints.calls, 1);
    EXPECT_EQ(ints.bytes, (ranks - 1) * held * 8);
  }
  // Rank 1 routes nothing to experts 0..3, so under ep 2 rank 0 receives no rows from it.
  if (ranks == 2) EXPECT_EQ(results[0].recv_rows[1], 0);
}

INSTANTIATE_TEST_SUITE_P(EpSizes, EpExchangeTest, ::testing::Values(2, 4),
                         [](const auto& info) { return "ep" + std::to_string(info.param); });

TEST(EpExchangeTest, OneRankIsThePermutationItself) {
  const std::vector<float> weights = ExpertWeights();
  const std::vector<RankData> data = {MakeRank(0, 11)};
  const Reference ref = Compute(data, weights);
  comm::SelfCommunicator self("ep");
  for (comm::Communicator* ep : {static_cast<comm::Communicator*>(nullptr), static_cast<comm::Communicator*>(&self)}) {
    const RankResult res = RunRank(data[0], weights, ep);
    ExpectNear(res.out, ref.out[0], "out");
    ExpectNear(res.d_x, ref.d_x[0], "d_x");
    ExpectNear(res.d_w, ref.d_w, "d_w");
  }
  EXPECT_TRUE(self.Stats().empty());  // a group of one moves nothing
}

TEST(EpExchangeTest, ExpertsMustShardEvenly) {
  comm::InProcessStore store;
  auto comms = comm::testing::MakeGroup(store, 3, absl::Seconds(30), "ep");
  auto ops = kernels::cpu::MakeCpuOps(1);
  auto made = EpExpertExchange::Create(comms[0].get(), ops.get(), kExperts);
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(made.status().message().find("model.moe.num_experts (8)"), std::string::npos) << made.status();
}

}  // namespace
}  // namespace loom::engine
