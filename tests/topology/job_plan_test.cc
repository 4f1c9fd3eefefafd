// DeriveJobPlan and the layout type: the one derivation of a job's pipeline
// plan, and LayoutOf / ApplyLayout as inverses.
#include "common/topology/job_plan.h"

#include <numeric>

#include "common/topology/mesh.h"
#include "gtest/gtest.h"

namespace loom::topology {
namespace {

spec::JobSpec Spec(int64_t pp, int64_t dp, spec::Schedule schedule, int64_t virtual_stages) {
  spec::JobSpec s;
  s.model.num_layers = 8;
  s.train.global_batch_size = 16;
  s.train.micro_batch_size = 2;
  s.parallelism.pp = pp;
  s.parallelism.dp = dp;
  s.parallelism.schedule = schedule;
  s.parallelism.virtual_stages = virtual_stages;
  return s;
}

TEST(LayoutOfTest, ResolvesUnsetAxesAndMicroBatches) {
  const spec::Layout l = spec::LayoutOf(Spec(2, 2, spec::Schedule::k1F1B, 1));
  EXPECT_EQ(l.pp, 2);
  EXPECT_EQ(l.dp, 2);
  EXPECT_EQ(l.tp, 1);
  EXPECT_EQ(l.cp, 1);
  EXPECT_EQ(l.ep, 1);
  EXPECT_EQ(l.zero_stage, 0);
  EXPECT_EQ(l.grad_accum, 4);  // 16 / (2 dp x 2 sequences)
  EXPECT_EQ(l.world(), 4);
}

TEST(LayoutOfTest, ApplyLayoutIsItsInverse) {
  spec::JobSpec s;
  s.parallelism.auto_all = true;
  spec::Layout l{.pp = 2, .dp = 2, .tp = 2, .zero_stage = 1};
  l.micro_batch_size = 4;
  l.grad_accum = s.train.global_batch_size / (2 * 4);
  l.schedule = spec::Schedule::kInterleaved;
  l.virtual_stages = 2;
  l.sequence_parallel = true;
  spec::ApplyLayout(l, &s);
  EXPECT_FALSE(s.parallelism.auto_all);
  EXPECT_EQ(spec::LayoutOf(s), l);
}

TEST(LayoutOfTest, TheMeshTakesTheLayout) {
  spec::JobSpec s = Spec(2, 2, spec::Schedule::k1F1B, 1);
  s.parallelism.tp = 2;
  absl::StatusOr<RankMesh> mesh = RankMesh::Create(spec::LayoutOf(s));
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  EXPECT_EQ(mesh->world_size(), 8);
  EXPECT_EQ(AxisSize(mesh->shape(), Axis::kTp), 2);
}

TEST(DeriveJobPlanTest, WithoutPipelineEveryLayerAndNoInstructions) {
  absl::StatusOr<JobPlan> plan = DeriveJobPlan(Spec(1, 4, spec::Schedule::k1F1B, 1));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->pipelined());
  std::vector<int64_t> all(8);
  std::iota(all.begin(), all.end(), 0);
  EXPECT_EQ(plan->LayersOf(0), all);
  EXPECT_TRUE(plan->InstructionsOf(0).empty());
  EXPECT_EQ(plan->bubble_fraction, 0);
}

TEST(DeriveJobPlanTest, StagesCoverTheLayersOnceWithTheirSchedule) {
  for (const auto& [schedule, v] : {std::pair{spec::Schedule::kAfab, 1},
                                     std::pair{spec::Schedule::k1F1B, 1},
                                     std::pair{spec::Schedule::kInterleaved, 2}}) {
    SCOPED_TRACE(spec::ScheduleName(schedule));
    absl::StatusOr<JobPlan> plan = DeriveJobPlan(Spec(2, 2, schedule, v));
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_TRUE(plan->pipelined());
    EXPECT_EQ(plan->schedule.microbatches, 4);
    EXPECT_DOUBLE_EQ(plan->bubble_fraction, 1.0 / (4.0 * v));
    std::vector<int> seen(8, 0);
    for (int64_t stage = 0; stage < 2; ++stage) {
      EXPECT_EQ(static_cast<int64_t>(plan->ChunksOf(stage).size()), v);
      for (int64_t layer : plan->LayersOf(stage)) ++seen[static_cast<size_t>(layer)];
      EXPECT_EQ(plan->InstructionsOf(stage), plan->schedule.stages[static_cast<size_t>(stage)]);
      EXPECT_FALSE(plan->InstructionsOf(stage).empty());
    }
    EXPECT_EQ(seen, std::vector<int>(8, 1));
  }
}

TEST(DeriveJobPlanTest, RefusesWhatTheScheduleCannotRun) {
  // 16 / (2 x 2) = 4 micro-batches are not a multiple of pp = 3.
  spec::JobSpec s = Spec(3, 2, spec::Schedule::kInterleaved, 2);
  s.model.num_layers = 12;
  EXPECT_FALSE(DeriveJobPlan(s).ok());
  EXPECT_FALSE(DeriveJobPlan(Spec(2, 1, spec::Schedule::k1F1B, 2)).ok());  // v > 1 needs interleaved
  EXPECT_FALSE(DeriveJobPlan(Spec(16, 1, spec::Schedule::k1F1B, 1)).ok());  // 8 layers < 16 stages
}

}  // namespace
}  // namespace loom::topology
