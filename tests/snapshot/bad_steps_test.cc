// Bad steps (docs/fault_tolerance.md, "Bad steps"), through the training run
// (RunTraining) with ranks as threads over real Gloo groups: a NaN written
// into one rank's gradient at step k leaves step k unapplied, and a loss
// spike injected at step k (with loss_spike_factor set) is rolled back to the
// snapshot of step k - 1 and its batch skipped. Both runs equal, bit for bit
// in every other step's loss and in the final parameters, a run told from
// the start to skip batch k (TrainingLoop::SkipBatch). Also the policy alone
// (bad_steps.h): the median, replayed steps, too many bad steps in a row.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tests/engine/test_util.h"
#include "tests/snapshot/mesh_attempt.h"
#include "worker/engine/bad_steps.h"
#include "worker/engine/snapshot_keeper.h"
#include "worker/engine/training_loop.h"
#include "worker/engine/training_run.h"

namespace loom::engine {
namespace {

using testing::MeshAttempt;
using testing::MeshLayout;
using testing::RunRanks;

constexpr int64_t kSteps = 7;
constexpr int64_t kBad = 5;  // the spike check needs 3 applied steps before it

struct Case {
  std::string name;
  MeshLayout layout;
  bool moe = false;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

struct RankRun {
  std::map<int64_t, StepProgress> steps;  // the last report of each step
  std::vector<int64_t> order;             // steps in the order reported
  std::vector<float> params;
  absl::Status status;
};

enum class Drill { kSkipFromStart, kNanGradient, kLossSpike };

class BadStepsTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override { testing::WriteTinyCorpus(dir_); }

  spec::JobSpec Job() const {
    const Case& c = GetParam();
    spec::JobSpec job = testing::TinyJob(dir_ / "train.txt", "");
    job.train.steps = kSteps;
    job.train.grad_clip = 0.5;
    if (c.moe) {
      spec::MoeSpec& m = job.model.moe;
      m.num_experts = 4;
      m.top_k = 2;
      m.expert_ffn_hidden_size = 16;
      m.num_shared_experts = 1;
      m.first_dense_layers = 1;
      m.aux_loss_coef = 0.01;
      m.bias_update_rate = 0.01;  // the biases move: a skipped step must not move them
    }
    c.layout.ApplyTo(&job);
    return job;
  }

  std::vector<RankRun> Run(Drill drill, const std::string& name) {
    const Case& c = GetParam();
    spec::JobSpec job = Job();
    if (drill == Drill::kLossSpike) job.fault_tolerance.loss_spike_factor = 3;
    const int n = c.layout.world();
    std::vector<RankRun> out(static_cast<size_t>(n));
    MeshAttempt attempt(store_, name, c.layout, [](int) { return std::vector<int>{}; });
    RunRanks(n, [&](int r) {
      RankRun& run = out[static_cast<size_t>(r)];
      auto loop = TrainingLoop::Create(job, attempt.Context(r));
      ASSERT_TRUE(loop.ok()) << loop.status();
      StepFaults faults;
      if (drill == Drill::kNanGradient && r == n - 1) faults.nan_gradient_step = kBad;  // one rank
      if (drill == Drill::kLossSpike) faults.loss_spike_step = kBad;  // the job's loss
      (*loop)->set_step_faults(faults);
      if (drill == Drill::kSkipFromStart) (*loop)->SkipBatch(kBad, "told to", 0);
      SnapshotKeeperOptions ko;
      ko.interval = 1;
      ko.rank = r;
      SnapshotKeeper keeper(ko);  // own snapshots only, as a rank without a buddy
      RunOptions options;
      options.snapshots = drill == Drill::kLossSpike ? &keeper : nullptr;
      options.on_step = [&run](const StepProgress& p) {
        run.steps[p.step] = p;
        run.order.push_back(p.step);
        return absl::OkStatus();
      };
      run.status = RunTraining(**loop, options);
      ASSERT_TRUE((*loop)->GatherParameters(&run.params).ok());
    });
    return out;
  }

  void ExpectSkippedLike(const std::vector<RankRun>& got, const std::vector<RankRun>& ref,
                         const std::string& why) {
    for (size_t r = 0; r < ref.size(); ++r) {
      ASSERT_TRUE(got[r].status.ok()) << got[r].status;
      std::vector<int64_t> every;
      for (int64_t s = 1; s <= kSteps; ++s) every.push_back(s);
      EXPECT_EQ(got[r].order, every) << "rank " << r << ": each step reported once, in order";
      for (int64_t s = 1; s <= kSteps; ++s) {
        const StepProgress& p = got[r].steps.at(s);
        EXPECT_EQ(p.skipped_steps, s < kBad ? 0 : 1) << "rank " << r << " step " << s;
        if (s == kBad) {
          EXPECT_NE(p.bad_step.find(why), std::string::npos) << p.bad_step;
          continue;
        }
        EXPECT_TRUE(p.bad_step.empty()) << "rank " << r << " step " << s << ": " << p.bad_step;
        EXPECT_EQ(p.loss, ref[r].steps.at(s).loss) << "rank " << r << " step " << s;
        EXPECT_EQ(p.grad_norm, ref[r].steps.at(s).grad_norm) << "rank " << r << " step " << s;
      }
      EXPECT_TRUE(got[r].params == ref[r].params) << "rank " << r << ": final parameters differ";
    }
  }

  testing::ScratchDir dir_;
  comm::InProcessStore store_;
};

TEST_P(BadStepsTest, ANonFiniteGradientIsNotAppliedAndTheRunEqualsOneThatSkippedTheBatch) {
  const std::vector<RankRun> ref = Run(Drill::kSkipFromStart, "reference");
  for (const RankRun& r : ref) ASSERT_TRUE(r.status.ok()) << r.status;
  // The reference's step k trained nothing: its batch was left out.
  EXPECT_EQ(ref[0].steps.at(kBad).bad_step, "told to");
  const std::vector<RankRun> got = Run(Drill::kNanGradient, "nan");
  ExpectSkippedLike(got, ref, "non-finite gradients");
  EXPECT_TRUE(std::isnan(got[0].steps.at(kBad).grad_norm));
}

TEST_P(BadStepsTest, ALossSpikeIsRolledBackAndItsBatchSkipped) {
  const std::vector<RankRun> ref = Run(Drill::kSkipFromStart, "reference");
  for (const RankRun& r : ref) ASSERT_TRUE(r.status.ok()) << r.status;
  const std::vector<RankRun> got = Run(Drill::kLossSpike, "spike");
  ExpectSkippedLike(got, ref, "loss spike");
  EXPECT_NE(got[0].steps.at(kBad).bad_step.find("rolled back to step 4"), std::string::npos)
      << got[0].steps.at(kBad).bad_step;
  // Without the rollback (the factor off) the spiked step is applied: the
  // run then differs from the skipping one, so the check above can fail.
}

std::vector<Case> Cases() {
  auto layout = [](int pp, int dp, int ep, int tp, int zero) {
    MeshLayout l;
    l.pp = pp;
    l.dp = dp;
    l.ep = ep;
    l.tp = tp;
    l.zero = zero;
    return l;
  };
  std::vector<Case> cases;
  cases.push_back({"one_rank", layout(1, 1, 1, 1, 0)});
  cases.push_back({"dp2_zero1", layout(1, 2, 1, 1, 1)});
  cases.push_back({"tp2_pp2", layout(2, 1, 1, 2, 0)});
  cases.push_back({"pp2_dp2_zero3", layout(2, 2, 1, 1, 3)});
  cases.push_back({"ep2_dp2_zero2_moe", layout(1, 2, 2, 1, 2), true});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Layouts, BadStepsTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.name; });

spec::FaultToleranceSpec Policy(double factor, int64_t window, int64_t max_bad) {
  spec::FaultToleranceSpec f;
  f.loss_spike_factor = factor;
  f.loss_spike_window = window;
  f.max_bad_steps = max_bad;
  return f;
}

TEST(BadStepPolicyTest, ASpikeIsMeasuredAgainstTheMedianOfTheRecentAppliedSteps) {
  BadStepPolicy policy(Policy(2, 3, 5));
  EXPECT_EQ(policy.SpikeReason(1, 1e9), "");  // no history yet
  ASSERT_TRUE(policy.Settle(1, "", 4.0).ok());
  ASSERT_TRUE(policy.Settle(2, "", 100.0).ok());  // an outlier does not move the median
  EXPECT_EQ(policy.SpikeReason(3, 1e9), "");      // two losses: still no verdict
  ASSERT_TRUE(policy.Settle(3, "", 3.0).ok());
  EXPECT_DOUBLE_EQ(policy.RecentMedian(), 4.0);
  EXPECT_EQ(policy.SpikeReason(4, 8.0), "");  // not above 2 x 4
  EXPECT_NE(policy.SpikeReason(4, 8.5).find("loss spike (8.5000 > 2 x the median 4.0000"),
            std::string::npos);
  EXPECT_EQ(policy.SpikeReason(3, 1e9), "");  // a step judged before (replayed) is not again
  ASSERT_TRUE(policy.Settle(4, "", 2.0).ok());  // the window keeps the last 3: 100, 3, 2
  EXPECT_DOUBLE_EQ(policy.RecentMedian(), 3.0);
  ASSERT_TRUE(policy.Settle(5, "non-finite gradients", std::nan("")).ok());
  EXPECT_DOUBLE_EQ(policy.RecentMedian(), 3.0);  // a bad step's loss never joins
  EXPECT_EQ(BadStepPolicy(Policy(0, 3, 5)).SpikeReason(1, 1e9), "");  // off
}

TEST(BadStepPolicyTest, TooManyBadStepsInARowFailNamingThem) {
  BadStepPolicy policy(Policy(0, 20, 3));
  ASSERT_TRUE(policy.Settle(1, "", 3.0).ok());
  ASSERT_TRUE(policy.Settle(2, "non-finite gradients", 0).ok());
  ASSERT_TRUE(policy.Settle(3, "loss spike", 0).ok());
  ASSERT_TRUE(policy.Settle(4, "", 3.0).ok());  // an applied step ends the run
  ASSERT_TRUE(policy.Settle(5, "a", 0).ok());
  ASSERT_TRUE(policy.Settle(6, "b", 0).ok());
  ASSERT_TRUE(policy.Settle(6, "b", 0).ok());  // settled before: not counted twice
  absl::Status failed = policy.Settle(7, "c", 0);
  EXPECT_EQ(failed.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(failed.message().find("3 bad steps in a row (fault_tolerance.max_bad_steps=3)"),
            std::string::npos)
      << failed.message();
  EXPECT_NE(failed.message().find("step 5: a; step 6: b; step 7: c"), std::string::npos)
      << failed.message();
  EXPECT_EQ(failed.message().find("step 2"), std::string::npos) << failed.message();
}

}  // namespace
}  // namespace loom::engine
