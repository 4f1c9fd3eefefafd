// The training loop under tensor parallelism against one process: ranks are
// threads with real Gloo groups. 10 optimizer steps (accumulation over 4
// micro-batches, clipping active, AdamW, evaluations at steps 5 and 10): the
// losses, gradient norms and validation losses of every step, and every
// parameter after the last step (assembled from the shards), must equal the
// single-process run's within 1e-5 relative. Layouts: tp2, tp2+sp (kv heads
// split and replicated), and dp2 x tp2 at ZeRO stages 0 to 3. Checkpoints
// move between tp2 (also dp2 x tp2 under ZeRO) and one process.
//
// Parameters compare per tensor in L2 norm: AdamW divides by sqrt(v), so
// single weights whose gradients are tiny amplify float reordering; two
// single-process runs that only accumulate in another order already differ by
// up to 8e-6 in the largest element of a tensor (5e-7 in norm), and TP by
// 1.7e-5 (1.2e-6 in norm).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tests/comm/mesh_groups.h"
#include "tests/comm/rank_harness.h"
#include "worker/engine/checkpoint/checkpoint_loader.h"
#include "tests/engine/test_util.h"
#include "tests/engine/train_steps.h"
#include "tests/model_tp/tp_test_util.h"
#include "worker/comm/in_process_store.h"
#include "worker/engine/tensor_parallel/tp_tensors.h"
#include "worker/engine/training_loop.h"

namespace loom::engine {
namespace {

constexpr int kSteps = 10;
constexpr double kTolerance = 1e-5;

struct TrainedRun {
  std::vector<StepProgress> steps;
  testing::TensorMap params;
};

class TpTrainingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::WriteTinyCorpus(dir_);
  }

  spec::JobSpec Job(int64_t kv_heads) const {
    spec::JobSpec job = testing::TinyJob(dir_ / "train.txt", dir_ / "val.txt");
    job.model.num_kv_heads = kv_heads;
    job.train.steps = kSteps;
    job.train.grad_clip = 0.5;  // below the early norms: clipping is exercised
    return job;
  }

  TrainedRun RunSingle(const spec::JobSpec& job) {
    absl::StatusOr<std::unique_ptr<TrainingLoop>> loop = TrainingLoop::Create(job);
    TrainedRun run;
    EXPECT_TRUE(loop.ok()) << loop.status();
    if (!loop.ok()) return run;
    run.steps = testing::TrainToEnd(**loop);
    run.params = testing::ToMap((*loop)->model().Parameters());
    return run;
  }

  // dp x tp ranks, tp fastest (global rank = dp_rank * tp + tp_rank). Each
  // rank restores from `restore` (when given), trains to step `until` (0: the
  // end) and saves under `save` (when given).
  std::vector<TrainedRun> RunLayout(spec::JobSpec job, int dp, int tp, bool sp, int zero_stage,
                                    const std::string& restore = "", int64_t until = 0,
                                    const std::string& save = "") {
    job.parallelism.dp = dp;
    job.parallelism.tp = tp;
    job.parallelism.sequence_parallel = sp;
    job.parallelism.zero_stage = zero_stage;
    const comm::testing::MeshGroups mesh(1, dp, tp);
    std::vector<TrainedRun> runs(mesh.size());
    mesh.RunRanks([&](int, int d, int t) {
      comm::Communicator* tp_comm = mesh.Tp(0, d, t);
      comm::Communicator* dp_comm = mesh.Dp(0, d, t);
      absl::StatusOr<std::unique_ptr<TrainingLoop>> loop =
          TrainingLoop::Create(job, d, dp, dp_comm, tp_comm);
      ASSERT_TRUE(loop.ok()) << loop.status();
      EXPECT_EQ((*loop)->zero_stage(), dp > 1 ? zero_stage : 0);
      TrainedRun& run = runs[mesh.Rank(0, d, t)];
      if (!restore.empty()) {
        absl::StatusOr<LoadedCheckpoint> loaded = (*loop)->RestoreNewest(restore);
        ASSERT_TRUE(loaded.ok()) << loaded.status();
      }
      run.steps = testing::TrainUntil(**loop, until > 0 ? until : job.train.steps);
      if (!save.empty()) {
        absl::StatusOr<std::string> saved = (*loop)->SaveCheckpoint(save);
        ASSERT_TRUE(saved.ok()) << saved.status();
      }
      std::vector<float> flat;
      ASSERT_TRUE((*loop)->GatherParameters(&flat).ok());  // ZeRO: whole local shards
      int64_t offset = 0;
      for (TensorView v : (*loop)->model().Parameters()) {
        v.data = flat.data() + offset;
        offset += v.numel();
        std::vector<float> global;
        ASSERT_TRUE(GatherGlobal(v, tp_comm, &global).ok());
        run.params[v.name] = std::move(global);
      }
    });
    return runs;
  }

  void ExpectSame(const std::vector<TrainedRun>& runs, const TrainedRun& one) {
    for (size_t r = 0; r < runs.size(); ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      const TrainedRun& run = runs[r];
      ASSERT_EQ(run.steps.size(), one.steps.size());
      for (size_t s = 0; s < one.steps.size(); ++s) {
        const StepProgress& a = run.steps[s];
        const StepProgress& b = one.steps[s];
        testing::ExpectStepNear(a, b, kTolerance);
      }
      EXPECT_GT(one.steps[0].grad_norm, 0.5) << "clipping should be active";
      testing::ExpectMapsNear(run.params, one.params, kTolerance, "parameters after 10 steps", true);
    }
  }

  testing::ScratchDir dir_;
};

TEST_F(TpTrainingTest, Tp2MatchesOneProcess) {
  const spec::JobSpec job = Job(2);
  ExpectSame(RunLayout(job, 1, 2, false, 0), RunSingle(job));
}

TEST_F(TpTrainingTest, Tp2SequenceParallelMatchesOneProcess) {
  const spec::JobSpec job = Job(2);
  ExpectSame(RunLayout(job, 1, 2, true, 0), RunSingle(job));
}

TEST_F(TpTrainingTest, Tp2SequenceParallelReplicatedKvMatchesOneProcess) {
  const spec::JobSpec job = Job(1);
  ExpectSame(RunLayout(job, 1, 2, true, 0), RunSingle(job));
}

TEST_F(TpTrainingTest, Dp2Tp2MatchesOneProcess) {
  const spec::JobSpec job = Job(2);
  const TrainedRun one = RunSingle(job);
  ExpectSame(RunLayout(job, 2, 2, true, 0), one);
  ExpectSame(RunLayout(job, 2, 2, false, 1), one);
}

// ZeRO under TP: the DP engine shards this rank's TP slice of the flat
// parameters; the norm adds the DP shards' and TP slices' squares.
TEST_F(TpTrainingTest, Dp2Tp2ZeroStagesMatchOneProcess) {
  const spec::JobSpec job = Job(2);
  const TrainedRun one = RunSingle(job);
  ExpectSame(RunLayout(job, 2, 2, true, 2), one);
  ExpectSame(RunLayout(job, 2, 2, false, 3), one);
  ExpectSame(RunLayout(job, 2, 2, true, 3), one);
}

// Checkpoints of ZeRO under TP hold global tensors: resuming the same layout
// is bit for bit, one process resumes them within the tolerance, and dp2 x tp2
// under ZeRO resumes one process's.
TEST_F(TpTrainingTest, ZeroUnderTpCheckpointsResume) {
  const spec::JobSpec job = Job(1);
  const TrainedRun straight = RunSingle(job);
  for (int zero : {1, 2, 3}) {
    SCOPED_TRACE("zero_stage " + std::to_string(zero));
    const std::string root = dir_ / ("ckpt_zero" + std::to_string(zero));
    const std::vector<TrainedRun> whole = RunLayout(job, 2, 2, true, zero);
    RunLayout(job, 2, 2, true, zero, "", 5, root);
    const std::vector<TrainedRun> resumed = RunLayout(job, 2, 2, true, zero, root);
    ASSERT_EQ(resumed.size(), whole.size());
    for (size_t r = 0; r < whole.size(); ++r) {
      ASSERT_EQ(resumed[r].steps.size(), 5u);
      for (size_t i = 0; i < 5; ++i) {
        EXPECT_EQ(resumed[r].steps[i].loss, whole[r].steps[5 + i].loss) << "rank " << r;
        EXPECT_EQ(resumed[r].steps[i].grad_norm, whole[r].steps[5 + i].grad_norm) << "rank " << r;
      }
      EXPECT_EQ(resumed[r].params, whole[r].params) << "rank " << r;
    }
    auto loop = TrainingLoop::Create(job);
    ASSERT_TRUE(loop.ok());
    ASSERT_TRUE((*loop)->RestoreNewest(root).ok());
    const std::vector<StepProgress> rest = testing::TrainToEnd(**loop);
    ASSERT_EQ(rest.size(), 5u);
    for (size_t i = 0; i < rest.size(); ++i) {
      EXPECT_NEAR(rest[i].loss, straight.steps[5 + i].loss, kTolerance * straight.steps[5 + i].loss);
    }
    testing::ExpectMapsNear(testing::ToMap((*loop)->model().Parameters()), straight.params,
                            kTolerance, "tp2 x dp2 ZeRO checkpoint resumed on one process", true);
    // And the other way: one process's step-5 checkpoint resumed at dp2 x tp2.
    const std::string single_root = dir_ / ("ckpt_single_for_zero" + std::to_string(zero));
    {
      auto single = TrainingLoop::Create(job);
      ASSERT_TRUE(single.ok());
      testing::TrainUntil(**single, 5);
      ASSERT_TRUE((*single)->SaveCheckpoint(single_root).ok());
    }
    const std::vector<TrainedRun> from_single = RunLayout(job, 2, 2, true, zero, single_root);
    for (const TrainedRun& run : from_single) {
      ASSERT_EQ(run.steps.size(), 5u);
      for (size_t i = 0; i < 5; ++i) {
        EXPECT_NEAR(run.steps[i].loss, straight.steps[5 + i].loss,
                    kTolerance * straight.steps[5 + i].loss);
      }
      testing::ExpectMapsNear(run.params, straight.params, kTolerance,
                              "one-process checkpoint resumed at dp2 x tp2 under ZeRO", true);
    }
  }
}

// Checkpoints hold global tensors: one saved at tp2+sp after 5 steps resumes
// on one process, and one saved by one process resumes at tp2; both continue
// as the uninterrupted single-process run does.
TEST_F(TpTrainingTest, CheckpointsMoveBetweenTpAndOneProcess) {
  const spec::JobSpec job = Job(1);
  const TrainedRun straight = RunSingle(job);
  const std::string tp_root = dir_ / "ckpt_tp", single_root = dir_ / "ckpt_single";

  // tp2 + sp: 5 steps, save.
  spec::JobSpec tp_job = job;
  tp_job.parallelism.tp = 2;
  tp_job.parallelism.sequence_parallel = true;
  {
    comm::InProcessStore store;
    auto group = comm::testing::MakeGroup(store, 2, absl::Seconds(60), "tp");
    comm::testing::RunRanks(group, [&](int, comm::Communicator& tp) {
      auto loop = TrainingLoop::Create(tp_job, 0, 1, nullptr, &tp);
      ASSERT_TRUE(loop.ok()) << loop.status();
      for (int s = 0; s < 5; ++s) ASSERT_TRUE((*loop)->TrainStep().ok());
      absl::StatusOr<std::string> dir = (*loop)->SaveCheckpoint(tp_root);
      ASSERT_TRUE(dir.ok()) << dir.status();
    });
  }
  // One process resumes it.
  {
    auto loop = TrainingLoop::Create(job);
    ASSERT_TRUE(loop.ok());
    absl::StatusOr<LoadedCheckpoint> loaded = (*loop)->RestoreNewest(tp_root);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(loaded->step, 5);
    const std::vector<StepProgress> rest = testing::TrainToEnd(**loop);
    ASSERT_EQ(rest.size(), 5u);
    for (size_t i = 0; i < rest.size(); ++i) {
      EXPECT_NEAR(rest[i].loss, straight.steps[5 + i].loss, kTolerance * straight.steps[5 + i].loss);
    }
    testing::ExpectMapsNear(testing::ToMap((*loop)->model().Parameters()), straight.params,
                            kTolerance, "tp2 checkpoint resumed on one process", true);
    // And one process's checkpoint at step 5, for tp2 to resume.
  }
  {
    auto loop = TrainingLoop::Create(job);
    ASSERT_TRUE(loop.ok());
    for (int s = 0; s < 5; ++s) ASSERT_TRUE((*loop)->TrainStep().ok());
    ASSERT_TRUE((*loop)->SaveCheckpoint(single_root).ok());
  }
  std::vector<std::vector<testing::Shard>> shards(2);
  std::vector<std::vector<StepProgress>> rest(2);
  {
    comm::InProcessStore store;
    auto group = comm::testing::MakeGroup(store, 2, absl::Seconds(60), "tp");
    comm::testing::RunRanks(group, [&](int rank, comm::Communicator& tp) {
      auto loop = TrainingLoop::Create(tp_job, 0, 1, nullptr, &tp);
      ASSERT_TRUE(loop.ok()) << loop.status();
      absl::StatusOr<LoadedCheckpoint> loaded = (*loop)->RestoreNewest(single_root);
      ASSERT_TRUE(loaded.ok()) << loaded.status();
      rest[rank] = testing::TrainToEnd(**loop);
      shards[rank] = testing::Snapshot((*loop)->model().Parameters());
    });
  }
  ASSERT_EQ(rest[0].size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_NEAR(rest[0][i].loss, straight.steps[5 + i].loss, kTolerance * straight.steps[5 + i].loss);
  }
  testing::ExpectMapsNear(testing::Assemble(shards), straight.params, kTolerance,
                          "one-process checkpoint resumed at tp2", true);
}

TEST_F(TpTrainingTest, CreateChecksTheTensorParallelSpec) {
  spec::JobSpec job = Job(2);
  job.parallelism.tp = 2;
  // Without a group the layout is ignored (the standalone trainer).
  absl::StatusOr<std::unique_ptr<TrainingLoop>> loop = TrainingLoop::Create(job);
  EXPECT_TRUE(loop.ok()) << loop.status();
  comm::InProcessStore store;
  auto group = comm::testing::MakeGroup(store, 2, absl::Seconds(30), "tp");
  job.model.num_heads = 2;
  job.model.num_kv_heads = 2;
  job.model.ffn_hidden_size = 63;
  loop = TrainingLoop::Create(job, 0, 1, nullptr, group[0].get());
  EXPECT_NE(loop.status().message().find("model.ffn_hidden_size=63"), std::string::npos)
      << loop.status();
  job = Job(2);
  job.parallelism.tp = 4;
  loop = TrainingLoop::Create(job, 0, 1, nullptr, group[0].get());
  EXPECT_NE(loop.status().message().find("parallelism.tp=4 but the tensor-parallel group has 2"),
            std::string::npos)
      << loop.status();
  job = Job(2);
  job.parallelism.tp = 2;
  job.parallelism.sequence_parallel = true;
  job.train.seq_len = 15;
  job.train.micro_batch_size = 1;
  job.train.global_batch_size = 8;
  loop = TrainingLoop::Create(job, 0, 1, nullptr, group[0].get());
  EXPECT_NE(loop.status().message().find("= 15 token rows over tp=2"), std::string::npos)
      << loop.status();
}

}  // namespace
}  // namespace loom::engine
