// Stage partition: balance with the embedding and LM head counted, Megatron's
// chunk-to-virtual-stage mapping, errors, and optimality against brute force.
#include "common/topology/stage_partition.h"

#include <algorithm>
#include <functional>

#include "gtest/gtest.h"

namespace loom::topology {
namespace {

std::vector<int64_t> Sizes(const StagePartition& p) {
  std::vector<int64_t> out;
  for (const ModelChunk& c : p.chunks) out.push_back(c.num_layers);
  return out;
}

StagePartition Partition(int64_t layers, int64_t pp, int64_t v, double emb, double head) {
  PartitionRequest r;
  r.num_layers = layers;
  r.pp = pp;
  r.virtual_stages = v;
  r.end_costs = EndCosts{emb, head};
  absl::StatusOr<StagePartition> p = PartitionLayers(r);
  EXPECT_TRUE(p.ok()) << p.status();
  return *p;
}

TEST(StagePartitionTest, EndCostsShiftLayers) {
  EXPECT_EQ(Sizes(Partition(8, 2, 1, 0, 0)), (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(Sizes(Partition(8, 2, 1, 1, 1)), (std::vector<int64_t>{4, 4}));
  // Head worth two layers: 5 | 3 + head, both cost 5.
  StagePartition p = Partition(8, 2, 1, 0, 2);
  EXPECT_EQ(Sizes(p), (std::vector<int64_t>{5, 3}));
  EXPECT_DOUBLE_EQ(p.chunks[0].cost, 5);
  EXPECT_DOUBLE_EQ(p.chunks[1].cost, 5);
  EXPECT_TRUE(p.chunks[1].has_lm_head);
  EXPECT_FALSE(p.chunks[0].has_lm_head);
  EXPECT_TRUE(p.chunks[0].has_embedding);
  // 6 layers on 4 stages with one layer's worth at each end: 1 2 2 1.
  EXPECT_EQ(Sizes(Partition(6, 4, 1, 1, 1)), (std::vector<int64_t>{1, 2, 2, 1}));
  // Ties put extra layers on later chunks.
  EXPECT_EQ(Sizes(Partition(5, 2, 1, 0, 0)), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(Sizes(Partition(7, 3, 1, 0, 0)), (std::vector<int64_t>{2, 2, 3}));
}

TEST(StagePartitionTest, InterleavedChunksFollowMegatron) {
  StagePartition p = Partition(8, 2, 2, 0, 0);
  // chunk c of stage s is virtual stage c*pp + s.
  EXPECT_EQ(p.At(0, 0).first_layer, 0);
  EXPECT_EQ(p.At(1, 0).first_layer, 2);
  EXPECT_EQ(p.At(0, 1).first_layer, 4);
  EXPECT_EQ(p.At(1, 1).first_layer, 6);
  EXPECT_EQ(p.At(0, 1).virtual_stage, 2);
  std::vector<ModelChunk> stage0 = p.ChunksOfStage(0);
  ASSERT_EQ(stage0.size(), 2u);
  EXPECT_EQ(stage0[0].first_layer, 0);
  EXPECT_EQ(stage0[1].first_layer, 4);
  EXPECT_EQ(stage0[1].num_layers, 2);
  EXPECT_TRUE(p.At(1, 1).has_lm_head);
  EXPECT_DOUBLE_EQ(p.StageCost(0), 4);
}

TEST(StagePartitionTest, Errors) {
  PartitionRequest r;
  r.num_layers = 3;
  r.pp = 2;
  r.virtual_stages = 2;
  r.end_costs = EndCosts{};
  absl::StatusOr<StagePartition> p = PartitionLayers(r);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("num_layers=3 is fewer than pp*virtual_stages=2*2=4"),
            std::string::npos)
      << p.status();
  r.num_layers = 4;
  r.layer_costs = {1, 1, 0, 1};
  EXPECT_NE(PartitionLayers(r).status().message().find("layer_costs[2]=0"), std::string::npos);
  r.layer_costs = {1, 1};
  EXPECT_FALSE(PartitionLayers(r).ok());
  r.layer_costs.clear();
  r.end_costs.reset();  // dims not given either
  EXPECT_NE(PartitionLayers(r).status().message().find("dims.hidden_size=0"), std::string::npos);
  r.pp = 0;
  EXPECT_FALSE(PartitionLayers(r).ok());
}

TEST(StagePartitionTest, DefaultEndCosts) {
  ModelDims d{.hidden_size = 128, .ffn_hidden_size = 384, .vocab_size = 256, .seq_len = 128,
              .num_heads = 4, .num_kv_heads = 2};
  // kv width 64; block weights 2*128^2 + 2*128*64 + 3*128*384 = 196608;
  // FLOPs per token 2*196608 + 2*128*128 = 425984; head 2*128*256 = 65536.
  absl::StatusOr<EndCosts> flops = DefaultEndCosts(d);
  ASSERT_TRUE(flops.ok()) << flops.status();
  EXPECT_DOUBLE_EQ(flops->lm_head, 65536.0 / 425984.0);
  EXPECT_DOUBLE_EQ(flops->embedding, 128.0 / 425984.0);
  absl::StatusOr<EndCosts> params = DefaultEndCosts(d, CostBasis::kParams);
  EXPECT_DOUBLE_EQ(params->embedding, 32768.0 / 196864.0);
  EXPECT_DOUBLE_EQ(params->lm_head, 32768.0 / 196864.0);
  d.tie_embeddings = true;
  EXPECT_DOUBLE_EQ(DefaultEndCosts(d, CostBasis::kParams)->lm_head, 0.0);
  // A Llama-7B-like shape: the head is worth well over half a block.
  ModelDims big{.hidden_size = 4096, .ffn_hidden_size = 11008, .vocab_size = 32000,
                .seq_len = 4096};
  EXPECT_GT(DefaultEndCosts(big)->lm_head, 0.5);
  EXPECT_LT(DefaultEndCosts(big)->lm_head, 0.7);
  // The partition derives them from dims when end costs are not given.
  PartitionRequest r;
  r.num_layers = 4;
  r.pp = 2;
  r.dims = d;
  absl::StatusOr<StagePartition> p = PartitionLayers(r);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_DOUBLE_EQ(p->end_costs.lm_head, flops->lm_head);
}

// The cut's largest chunk equals the best over every possible cut.
TEST(StagePartitionTest, MatchesBruteForce) {
  const std::vector<double> pool = {1.0, 0.5, 2.0, 1.5, 0.75, 3.0, 1.0, 1.25, 0.5};
  const std::vector<std::pair<double, double>> ends = {{0, 0}, {1, 1}, {0.2, 2.5}, {3, 0.4}};
  int cases = 0;
  for (int64_t n = 1; n <= 9; ++n)
    for (int64_t pp = 1; pp <= 4; ++pp)
      for (int64_t v = 1; v <= 2; ++v)
        for (const auto& [emb, head] : ends) {
          const int64_t k = pp * v;
          if (n < k) continue;
          PartitionRequest r;
          r.num_layers = n;
          r.pp = pp;
          r.virtual_stages = v;
          r.end_costs = EndCosts{emb, head};
          r.layer_costs.assign(pool.begin(), pool.begin() + n);
          absl::StatusOr<StagePartition> p = PartitionLayers(r);
          ASSERT_TRUE(p.ok()) << p.status();
          // Brute force over all cut positions.
          double best = 1e18;
          std::vector<int64_t> cut(k + 1, 0);
          cut[k] = n;
          std::function<void(int64_t, int64_t)> rec = [&](int64_t idx, int64_t start) {
            if (idx == k) {
              double worst = 0;
              for (int64_t c = 0; c < k; ++c) {
                double cost = 0;
                for (int64_t l = cut[c]; l < cut[c + 1]; ++l) cost += pool[l];
                if (c == 0) cost += emb;
                if (c == k - 1) cost += head;
                worst = std::max(worst, cost);
              }
              best = std::min(best, worst);
              return;
            }
            if (idx == 0) {
              rec(1, 0);
              return;
            }
            for (int64_t s = start + 1; s <= n - (k - idx); ++s) {
              cut[idx] = s;
              rec(idx + 1, s);
            }
          };
          rec(0, 0);
          EXPECT_NEAR(p->MaxChunkCost(), best, 1e-9) << "n=" << n << " pp=" << pp << " v=" << v;
          int64_t covered = 0;
          for (int64_t vs = 0; vs < k; ++vs) {
            const ModelChunk& c = p->chunks[vs];
            ASSERT_EQ(c.first_layer, covered);
            ASSERT_GE(c.num_layers, 1);
            ASSERT_EQ(c.stage, vs % pp);
            ASSERT_EQ(c.chunk, vs / pp);
            covered += c.num_layers;
          }
          ASSERT_EQ(covered, n);
          ++cases;
        }
  EXPECT_GT(cases, 100);
}

}  // namespace
}  // namespace loom::topology
