// The training loop under context parallelism against one process: ranks are
// threads with real Gloo groups (CP, DP, DP x CP, TP, PP as the layout asks).
// 10 optimizer steps with accumulation, clipping and evaluations: every
// step's loss, gradient norm and validation loss, and (without PP) every
// parameter after the last step, equal the single-process run's within 1e-5
// relative. Layouts: cp2, cp4, cp2 x tp2 with SP, cp2 x dp2 under ZeRO 0/2/3,
// cp2 x pp2 (1F1B, AFAB, interleaved; with dp2 under ZeRO-1), cp2 x tp2 x dp2;
// checkpoints move between cp layouts and one process, and (the one
// checkpoint path of every layout) between CP layouts and TP, PP, ZeRO-3 ones.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/comm/rank_harness.h"
#include "tests/engine/test_util.h"
#include "tests/engine/train_steps.h"
#include "tests/model_tp/tp_test_util.h"
#include "worker/comm/in_process_store.h"
#include "worker/engine/checkpoint/checkpoint_loader.h"
#include "worker/engine/checkpoint/checkpoint_reader.h"
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

struct Layout {
  int pp = 1, dp = 1, cp = 1, tp = 1;
  bool sp = false;
  int zero = 0;
};

// Every group of a pp x dp x cp x tp mesh (tp fastest), keyed by the
// coordinates it does not span; member index = position along its axes.
class Mesh {
 public:
  explicit Mesh(const Layout& l) : l_(l) {
    for (int p = 0; p < l.pp; ++p)
      for (int d = 0; d < l.dp; ++d)
        for (int k = 0; k < l.cp; ++k)
          for (int t = 0; t < l.tp; ++t) coords_.push_back({p, d, k, t});
    // Each axis set: a key (the other coordinates) and a member index.
    Build("tp", l.tp, [](const C& c) { return Key{c.p, c.d, c.k}; }, [](const C& c) { return c.t; });
    Build("cp", l.cp, [](const C& c) { return Key{c.p, c.d, c.t}; }, [](const C& c) { return c.k; });
    Build("dp", l.dp, [](const C& c) { return Key{c.p, c.k, c.t}; }, [](const C& c) { return c.d; });
    Build("pp", l.pp, [](const C& c) { return Key{c.d, c.k, c.t}; }, [](const C& c) { return c.p; });
    if (l.cp > 1) {
      const int cp = l.cp;
      Build("dp_cp", l.dp * l.cp, [](const C& c) { return Key{c.p, c.t, 0}; },
            [cp](const C& c) { return c.d * cp + c.k; });
    }
  }
  struct C {
    int p, d, k, t;
  };
  using Key = std::array<int, 3>;
  comm::Communicator* Group(const std::string& axis, size_t rank) const {
    auto it = member_.find({axis, rank});
    return it == member_.end() ? nullptr : it->second;
  }
  const std::vector<C>& coords() const { return coords_; }

 private:
  template <typename KeyFn, typename IndexFn>
  void Build(const std::string& axis, int size, KeyFn key, IndexFn index) {
    if (size <= 1) return;
    std::map<Key, std::vector<size_t>> groups;
    for (size_t r = 0; r < coords_.size(); ++r) groups[key(coords_[r])].push_back(r);
    for (auto& [k, ranks] : groups) {
      owned_.push_back(comm::testing::MakeGroup(store_, size, absl::Seconds(60), axis));
      for (size_t r : ranks) member_[{axis, r}] = owned_.back()[index(coords_[r])].get();
    }
  }
  Layout l_;
  std::vector<C> coords_;
  comm::InProcessStore store_;
  std::vector<std::vector<std::unique_ptr<comm::Communicator>>> owned_;
  std::map<std::pair<std::string, size_t>, comm::Communicator*> member_;
};

class CpTrainingTest : public ::testing::Test {
 protected:
  void SetUp() override { testing::WriteTinyCorpus(dir_); }

  spec::JobSpec Job() const {
    spec::JobSpec job = testing::TinyJob(dir_ / "train.txt", dir_ / "val.txt");
    job.train.steps = kSteps;
    job.train.grad_clip = 0.5;  // below the early norms: clipping is exercised
    return job;
  }

  TrainedRun RunSingle(const spec::JobSpec& job, const std::string& restore = "") {
    absl::StatusOr<std::unique_ptr<TrainingLoop>> loop = TrainingLoop::Create(job);
    TrainedRun run;
    EXPECT_TRUE(loop.ok()) << loop.status();
    if (!loop.ok()) return run;
    if (!restore.empty()) {
      EXPECT_TRUE((*loop)->RestoreNewest(restore).ok());
    }
    run.steps = testing::TrainToEnd(**loop);
    run.params = testing::ToMap((*loop)->model().Parameters());
    return run;
  }

  std::vector<TrainedRun> RunLayout(spec::JobSpec job, const Layout& l, int64_t until = 0,
                                    const std::string& save = "",
                                    const std::string& restore = "") {
    job.parallelism.dp = l.dp;
    job.parallelism.tp = l.tp;
    job.parallelism.pp = l.pp;
    job.parallelism.cp = l.cp;
    job.parallelism.sequence_parallel = l.sp;
    job.parallelism.zero_stage = l.zero;
    const Mesh mesh(l);
    std::vector<TrainedRun> runs(mesh.coords().size());
    std::vector<std::thread> threads;
    for (size_t r = 0; r < mesh.coords().size(); ++r) {
      threads.emplace_back([&, r] {
        const Mesh::C c = mesh.coords()[r];
        absl::StatusOr<ParallelContext> ctx = ParallelContext::Make(
            c.d, l.dp, mesh.Group("dp", r), mesh.Group("tp", r), mesh.Group("pp", r),
            mesh.Group("cp", r), mesh.Group("dp_cp", r));
        ASSERT_TRUE(ctx.ok()) << ctx.status();
        absl::StatusOr<std::unique_ptr<TrainingLoop>> loop = TrainingLoop::Create(job, *ctx);
        ASSERT_TRUE(loop.ok()) << loop.status();
        TrainedRun& run = runs[r];
        if (!restore.empty()) {
          absl::StatusOr<LoadedCheckpoint> loaded = (*loop)->RestoreNewest(restore);
          ASSERT_TRUE(loaded.ok()) << loaded.status();
        }
        run.steps = testing::TrainUntil(**loop, until > 0 ? until : job.train.steps);
        if (!save.empty()) {
          absl::StatusOr<std::string> saved = (*loop)->SaveCheckpoint(save);
          ASSERT_TRUE(saved.ok()) << saved.status();
        }
        if (l.pp > 1) return;  // the stages' parameters: compared through the jobs' tests
        std::vector<float> flat;
        ASSERT_TRUE((*loop)->GatherParameters(&flat).ok());
        int64_t offset = 0;
        for (TensorView v : (*loop)->model().Parameters()) {
          v.data = flat.data() + offset;
          offset += v.numel();
          std::vector<float> global;
          ASSERT_TRUE(GatherGlobal(v, mesh.Group("tp", r), &global).ok());
          run.params[v.name] = std::move(global);
        }
      });
    }
    for (auto& t : threads) t.join();
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
      if (!run.params.empty()) {
        testing::ExpectMapsNear(run.params, one.params, kTolerance, "parameters after 10 steps",
                                true);
      }
    }
  }

  // Every rank of a run resumed at step 5 continues the uninterrupted one.
  static void ExpectResumed(const std::vector<TrainedRun>& runs, const TrainedRun& straight,
                            const std::string& what) {
    for (size_t r = 0; r < runs.size(); ++r) {
      SCOPED_TRACE(what + ", rank " + std::to_string(r));
      const TrainedRun& run = runs[r];
      ASSERT_EQ(run.steps.size(), 5u);
      for (size_t i = 0; i < 5; ++i) {
        const StepProgress& b = straight.steps[5 + i];
        EXPECT_EQ(run.steps[i].step, b.step);
        EXPECT_NEAR(run.steps[i].loss, b.loss, kTolerance * b.loss);
        EXPECT_NEAR(run.steps[i].grad_norm, b.grad_norm, kTolerance * b.grad_norm);
      }
      if (!run.params.empty()) testing::ExpectMapsNear(run.params, straight.params, kTolerance, what, true);
    }
  }

  testing::ScratchDir dir_;
};

TEST_F(CpTrainingTest, Cp2MatchesOneProcess) {
  const spec::JobSpec job = Job();
  ExpectSame(RunLayout(job, {.cp = 2}), RunSingle(job));
}

TEST_F(CpTrainingTest, Cp4MatchesOneProcess) {
  const spec::JobSpec job = Job();
  ExpectSame(RunLayout(job, {.cp = 4}), RunSingle(job));
}

TEST_F(CpTrainingTest, Cp2Tp2SequenceParallelMatchesOneProcess) {
  const spec::JobSpec job = Job();
  ExpectSame(RunLayout(job, {.cp = 2, .tp = 2, .sp = true}), RunSingle(job));
}

TEST_F(CpTrainingTest, Cp2Dp2ZeroStagesMatchOneProcess) {
  const spec::JobSpec job = Job();
  const TrainedRun one = RunSingle(job);
  for (int zero : {0, 2, 3}) {
    SCOPED_TRACE("zero_stage " + std::to_string(zero));
    ExpectSame(RunLayout(job, {.dp = 2, .cp = 2, .zero = zero}), one);
  }
}

TEST_F(CpTrainingTest, Cp2Pp2MatchesOneProcess) {
  spec::JobSpec job = Job();
  job.parallelism.schedule = spec::Schedule::k1F1B;
  ExpectSame(RunLayout(job, {.pp = 2, .cp = 2}), RunSingle(job));
}

// Every pipeline schedule composes with CP; ZeRO-1 under PP shards over DP x CP.
TEST_F(CpTrainingTest, Cp2Pp2OtherSchedulesAndZeroMatchOneProcess) {
  spec::JobSpec job = Job();
  job.model.num_layers = 4;  // interleaved: 2 stages x 2 chunks
  const TrainedRun one = RunSingle(job);
  job.parallelism.schedule = spec::Schedule::kAfab;
  ExpectSame(RunLayout(job, {.pp = 2, .cp = 2}), one);
  job.parallelism.schedule = spec::Schedule::kInterleaved;
  job.parallelism.virtual_stages = 2;
  ExpectSame(RunLayout(job, {.pp = 2, .cp = 2}), one);
  job.parallelism.schedule = spec::Schedule::k1F1B;
  job.parallelism.virtual_stages = 1;
  ExpectSame(RunLayout(job, {.pp = 2, .dp = 2, .cp = 2, .zero = 1}), one);
}

TEST_F(CpTrainingTest, Cp2Tp2Dp2MatchesOneProcess) {
  const spec::JobSpec job = Job();
  ExpectSame(RunLayout(job, {.dp = 2, .cp = 2, .tp = 2}), RunSingle(job));
}

// CP ranks hold the same weights: one writes, and one process resumes it.
TEST_F(CpTrainingTest, Cp2CheckpointResumesOnOneProcess) {
  const spec::JobSpec job = Job();
  const TrainedRun straight = RunSingle(job);
  for (int zero : {0, 2}) {
    SCOPED_TRACE("zero_stage " + std::to_string(zero));
    const std::string root = dir_ / ("ckpt_cp2_zero" + std::to_string(zero));
    RunLayout(job, {.dp = 2, .cp = 2, .zero = zero}, 5, root);
    const TrainedRun resumed = RunSingle(job, root);
    ASSERT_EQ(resumed.steps.size(), 5u);
    for (size_t i = 0; i < 5; ++i) {
      EXPECT_NEAR(resumed.steps[i].loss, straight.steps[5 + i].loss,
                  kTolerance * straight.steps[5 + i].loss);
    }
    testing::ExpectMapsNear(resumed.params, straight.params, kTolerance,
                            "cp2 checkpoint resumed on one process", true);
  }
}

// The context refuses CP without its DP x CP group, and one of the wrong
// size; with DP of one the CP group is the DP x CP group.
TEST(CpContext, NeedsTheDpCpGroup) {
  comm::InProcessStore store;
  auto cp = comm::testing::MakeGroup(store, 2, absl::Seconds(30), "cp");
  auto dp = comm::testing::MakeGroup(store, 2, absl::Seconds(30), "dp");
  absl::StatusOr<ParallelContext> alone =
      ParallelContext::Make(0, 1, nullptr, nullptr, nullptr, cp[0].get());
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_EQ(alone->grad_group(), cp[0].get());
  EXPECT_EQ(alone->cp_size(), 2);
  absl::StatusOr<ParallelContext> missing =
      ParallelContext::Make(0, 2, dp[0].get(), nullptr, nullptr, cp[0].get());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("needs a DP x CP communicator of 4 ranks"),
            std::string::npos)
      << missing.status();
  absl::StatusOr<ParallelContext> wrong =
      ParallelContext::Make(0, 2, dp[0].get(), nullptr, nullptr, cp[0].get(), dp[0].get());
  EXPECT_FALSE(wrong.ok());
}

// And the other way: one process's step-5 checkpoint resumed at cp2 x tp2
// (SP) and at cp2 x dp2 under ZeRO-2.
TEST_F(CpTrainingTest, OneProcessCheckpointResumesUnderCp) {
  const spec::JobSpec job = Job();
  const TrainedRun straight = RunSingle(job);
  const std::string root = dir_ / "ckpt_single_for_cp";
  {
    auto single = TrainingLoop::Create(job);
    ASSERT_TRUE(single.ok());
    testing::TrainUntil(**single, 5);
    ASSERT_TRUE((*single)->SaveCheckpoint(root).ok());
  }
  for (const Layout& l : {Layout{.cp = 2, .tp = 2, .sp = true}, Layout{.dp = 2, .cp = 2, .zero = 2}}) {
    SCOPED_TRACE("cp" + std::to_string(l.cp) + " tp" + std::to_string(l.tp) + " dp" +
                 std::to_string(l.dp));
    const std::vector<TrainedRun> runs = RunLayout(job, l, 0, "", root);
    for (const TrainedRun& run : runs) {
      ASSERT_EQ(run.steps.size(), 5u);
      for (size_t i = 0; i < 5; ++i) {
        EXPECT_NEAR(run.steps[i].loss, straight.steps[5 + i].loss,
                    kTolerance * straight.steps[5 + i].loss);
      }
      testing::ExpectMapsNear(run.params, straight.params, kTolerance,
                              "one process's checkpoint resumed under CP", true);
    }
  }
}

// The one checkpoint path under CP: a cp2 step is written by CP rank 0 alone
// (CP replicates the weights and, without ZeRO, the moments), records cp in
// its layout, and resumes under TP x DP with ZeRO-3; a cp2 x pp2 x dp2 ZeRO-3
// step (shards over DP x CP) resumes the same way.
TEST_F(CpTrainingTest, CpCheckpointReshardsToOtherLayouts) {
  const spec::JobSpec job = Job();
  const TrainedRun straight = RunSingle(job);
  const Layout to{.dp = 2, .tp = 2, .zero = 3};
  {
    const std::string root = dir_ / "ckpt_cp2";
    RunLayout(job, {.cp = 2}, 5, root);
    absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(root + "/step_00000005");
    ASSERT_TRUE(reader.ok()) << reader.status();
    EXPECT_EQ(reader->state()["layout"]["cp"], 2);
    for (const CheckpointTensorInfo& info : reader->tensors()) {
      for (const CheckpointShardInfo& shard : info.shards) {
        EXPECT_NE(shard.file.find("-r00000."), std::string::npos) << info.name << " in " << shard.file;
      }
    }
    ExpectResumed(RunLayout(job, to, 0, "", root), straight, "cp2 -> tp2 x dp2 ZeRO-3");
  }
  {
    const std::string root = dir_ / "ckpt_cp2_pp2_dp2_zero3";
    RunLayout(job, {.pp = 2, .dp = 2, .cp = 2, .zero = 3}, 5, root);
    ExpectResumed(RunLayout(job, to, 0, "", root), straight,
                  "cp2 x pp2 x dp2 ZeRO-3 -> tp2 x dp2 ZeRO-3");
  }
}

// And into CP: a tp2 x pp2 x dp2 ZeRO-3 step resumes at cp4 under ZeRO-3
// (shards over the CP group alone) and at cp2 x tp2 x dp2 under ZeRO-2.
TEST_F(CpTrainingTest, OtherLayoutsCheckpointReshardsIntoCp) {
  const spec::JobSpec job = Job();
  const TrainedRun straight = RunSingle(job);
  const std::string root = dir_ / "ckpt_tp2_pp2_dp2_zero3";
  RunLayout(job, {.pp = 2, .dp = 2, .tp = 2, .zero = 3}, 5, root);
  ExpectResumed(RunLayout(job, {.cp = 4, .zero = 3}, 0, "", root), straight,
                "tp2 x pp2 x dp2 ZeRO-3 -> cp4 ZeRO-3");
  ExpectResumed(RunLayout(job, {.dp = 2, .cp = 2, .tp = 2, .zero = 2}, 0, "", root), straight,
                "tp2 x pp2 x dp2 ZeRO-3 -> cp2 x tp2 x dp2 ZeRO-2");
}

}  // namespace
}  // namespace loom::engine
