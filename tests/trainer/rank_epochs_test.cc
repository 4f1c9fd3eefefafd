// The trainer's epoch loop (worker/trainer/rank_epochs.h) with a dp4 ZeRO-1
// job whose ranks are threads (epoch_cluster.h; the test plays the
// coordinator with its own decision and messages, so both sides of the
// contract meet). A rank crashes after step 4: the survivors' collectives
// fail on their own, they report "aborted" with their snapshots and wait; the
// decision from their reports moves them to attempt 2 (EnterEpoch) and
// relaunches the crashed rank, which receives its snapshot from its buddy. A rank hangs instead:
// the test aborts the others (AbortRanks), which leave their blocked collective without any peer
// dying, then kills and relaunches the hung one. In both, every survivor's loop never returned, no
// step up to the restore step is trained twice, every loss equals the uninterrupted run's bit for
// bit and the final checkpoint is byte-identical to it. Also: no EnterEpoch in time ends the rank
// with DEADLINE_EXCEEDED (exit code 4), and without in-place recovery a failure ends the rank as
// before.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/exit_codes.h"
#include "tests/engine/test_util.h"
#include "tests/trainer/epoch_cluster.h"
#include "worker/trainer/standalone.h"

namespace loom::trainer {
namespace {

namespace fs = std::filesystem;
using testing::EpochCluster;

constexpr int64_t kSteps = 8;
constexpr int kRanks = 4;

spec::Layout Dp4() {
  spec::Layout l;
  l.dp = 4;
  return l;
}

// Four nodes of one rank: each rank's buddy is the next node's rank.
const std::vector<int> kFourNodes = {1, 1, 1, 1};

class RankEpochsTest : public ::testing::Test {
 protected:
  void SetUp() override { engine::testing::WriteTinyCorpus(dir_); }

  spec::JobSpec Job() const {
    spec::JobSpec job = engine::testing::TinyJob(dir_ / "train.txt", dir_ / "val.txt");
    job.train.steps = kSteps;
    job.train.eval_interval = 4;
    job.parallelism.dp = 4;
    job.parallelism.zero_stage = 1;
    job.checkpoint.interval = 0;  // only the final step: the recovery uses snapshots
    return job;
  }

  // Each step's loss as rank 0 reported it, in report order, and the steps.
  static std::vector<std::pair<int64_t, double>> StepLosses(const testing::Recorder& r) {
    std::vector<std::pair<int64_t, double>> out;
    for (const auto& p : r.Of("step")) out.push_back({p.step(), p.loss()});
    return out;
  }

  std::map<int64_t, double> Reference() {
    EpochCluster c(Job(), Dp4(), kFourNodes, 30, (dir_ / "reference"));
    for (int r = 0; r < kRanks; ++r) {
      c.Launch(c.FirstAssignment(r));
    }
    c.JoinAll();
    std::map<int64_t, double> losses;
    for (int r = 0; r < kRanks; ++r) EXPECT_TRUE(c.result(r).ok()) << c.result(r);
    for (const auto& [step, loss] : StepLosses(c.reports(0))) losses[step] = loss;
    EXPECT_EQ(losses.size(), static_cast<size_t>(kSteps));
    return losses;
  }

  // What every recovery must show: the survivors ran through, the relaunched
  // rank restored, each step up to the restore step was trained once, every
  // loss is the reference's and the final checkpoint is the reference's.
  void ExpectRecoveredExactly(EpochCluster& c, const std::map<int64_t, double>& reference,
                              int failed, int64_t restore_step) {
    c.JoinAll();
    for (int r = 0; r < kRanks; ++r)
      EXPECT_TRUE(c.result(r).ok()) << "rank " << r << ": " << c.result(r);
    std::map<int64_t, int> trained;
    for (const auto& [step, loss] : StepLosses(c.reports(0))) {
      ++trained[step];
      EXPECT_EQ(loss, reference.at(step)) << "step " << step;
    }
    for (int64_t s = 1; s <= kSteps; ++s) {
      if (s <= restore_step) {
        EXPECT_EQ(trained[s], 1) << "step " << s << " was trained again";
      } else {  // at most the steps after the restore step, once more
        EXPECT_GE(trained[s], 1) << "step " << s;
        EXPECT_LE(trained[s], 2) << "step " << s;
      }
    }
    // Attempt 2: everyone ready, resumed after the restore step, finished.
    for (int r = 0; r < kRanks; ++r) {
      const auto resumed = c.reports(r).Of("resumed", 2);
      ASSERT_EQ(resumed.size(), 1u) << "rank " << r;
      EXPECT_EQ(resumed[0].resumed_step(), restore_step);
      EXPECT_EQ(c.reports(r).Of("finished", 2).size(), 1u) << "rank " << r;
    }
    // The survivors met in attempt 2's namespace with attempt 2's tokens.
    std::set<std::pair<std::string, std::string>> opened;
    for (const auto& o : c.opened()) opened.insert(o);
    for (int r = 0; r < kRanks; ++r) {
      EXPECT_TRUE(opened.count({testing::Namespace(2), testing::Token(2, r)})) << "rank " << r;
    }
    EXPECT_FALSE(opened.count({testing::Namespace(2), testing::Token(1, failed)}));
    // The final checkpoint went through the commit gate of attempt 2.
    EXPECT_TRUE(
        c.store()
            .Get(absl::StrCat(testing::Namespace(2), "/loom/commit/", kSteps), absl::Seconds(1))
            .ok());
    ExpectSameCheckpoint((dir_ / "reference"), (dir_ / "recovered"));
  }

  static void ExpectSameCheckpoint(const std::string& a, const std::string& b) {
    const std::string step = "step_00000008";
    int compared = 0;
    for (const auto& entry : fs::directory_iterator(fs::path(a) / step)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("model-", 0) != 0 && name.rfind("optimizer-", 0) != 0) continue;
      EXPECT_EQ(engine::testing::ReadFile(entry.path().string()),
                engine::testing::ReadFile((fs::path(b) / step / name).string()))
          << name;
      ++compared;
    }
    EXPECT_GE(compared, 2);
  }

  engine::testing::ScratchDir dir_;
};

TEST_F(RankEpochsTest, ACrashedRankIsRelaunchedFromItsBuddysCopyWhileTheOthersRollBack) {
  const std::map<int64_t, double> reference = Reference();
  EpochCluster c(Job(), Dp4(), kFourNodes, 30, (dir_ / "recovered"));
  constexpr int kFailed = 2;
  for (int r = 0; r < kRanks; ++r) {
    c.Launch(c.FirstAssignment(r), [r](int attempt, int64_t step) {
      if (r == kFailed && attempt == 1 && step == 4) {
        return absl::InternalError("killed after step 4 (fault drill)");
      }
      return absl::OkStatus();
    });
  }
  const std::vector<int> survivors = {0, 1, 3};
  // Nobody tells them: their collectives fail when rank 2 is gone.
  ASSERT_TRUE(c.WaitForPhase(survivors, "aborted", 1));
  c.Join(kFailed);
  EXPECT_TRUE(absl::IsInternal(c.result(kFailed))) << c.result(kFailed);
  for (int r : survivors) {
    const auto aborted = c.reports(r).Of("aborted", 1).back();
    EXPECT_GE(aborted.snapshots().own_steps_size(), 1) << "rank " << r;
    EXPECT_GT(aborted.snapshots().snapshot_bytes(), 0) << "rank " << r;
  }
  absl::StatusOr<coordinator::InPlaceDecision> decision = c.RecoverInPlace(kFailed, 1, 2);
  ASSERT_TRUE(decision.ok()) << decision.status();
  // The copy of step 4 may have been cut short by the crash; step 3's was
  // acknowledged before step 4's snapshot began.
  const int64_t restore = decision->restore_step;
  ASSERT_TRUE(restore == 3 || restore == 4) << restore;
  ASSERT_EQ(decision->relaunched.size(), 1u);
  EXPECT_EQ(decision->relaunched[0].peer, c.Buddy(kFailed));
  ExpectRecoveredExactly(c, reference, kFailed, restore);
}

TEST_F(RankEpochsTest, AnAbortOrderFreesRanksBlockedOnAHungPeer) {
  const std::map<int64_t, double> reference = Reference();
  EpochCluster c(Job(), Dp4(), kFourNodes, 30, (dir_ / "recovered"));
  constexpr int kHung = 1;
  absl::Notification hung, killed;
  for (int r = 0; r < kRanks; ++r) {
    c.Launch(c.FirstAssignment(r), [r, &hung, &killed](int attempt, int64_t step) {
      if (r == kHung && attempt == 1 && step == 3) {
        hung.Notify();
        killed.WaitForNotification();  // hangs until the "SIGKILL"
        return absl::InternalError("killed while hung");
      }
      return absl::OkStatus();
    });
  }
  ASSERT_TRUE(hung.WaitForNotificationWithTimeout(absl::Seconds(120)));
  const std::vector<int> survivors = {0, 2, 3};
  c.Abort(survivors, 1, "rank 1 hung (diagnosed culprit)");
  // They leave their blocked collective while the hung rank still holds its
  // connections open: the abort order alone frees them.
  ASSERT_TRUE(c.WaitForPhase(survivors, "aborted", 1));
  killed.Notify();
  c.Join(kHung);
  absl::StatusOr<coordinator::InPlaceDecision> decision = c.RecoverInPlace(kHung, 1, 2);
  ASSERT_TRUE(decision.ok()) << decision.status();
  const int64_t restore = decision->restore_step;
  ASSERT_TRUE(restore == 2 || restore == 3) << restore;
  ExpectRecoveredExactly(c, reference, kHung, restore);
}

TEST_F(RankEpochsTest, AStopToldToOneRankStopsTheWholeJobAfterOneStepSavedAndItResumesExactly) {
  const std::map<int64_t, double> reference = Reference();
  constexpr int64_t kStopAfter = 3;
  {
    EpochCluster c(Job(), Dp4(), kFourNodes, 30, (dir_ / "recovered"));
    for (int r = 0; r < kRanks; ++r) {
      // Rank 2 alone hears of the stop, as its step 3 ends: every rank's vote
      // after that step sees it.
      c.Launch(c.FirstAssignment(r), [r, &c](int, int64_t step) {
        if (r == 2 && step == kStopAfter) c.Stop(2, "preempted by job-9 (priority 5)");
        return absl::OkStatus();
      });
    }
    c.JoinAll();
    for (int r = 0; r < kRanks; ++r) {
      const absl::Status s = c.result(r);
      EXPECT_EQ(ExitCodeFor(s), kExitStopped) << "rank " << r << ": " << s;
      const auto stopped = c.reports(r).Of("stopped", 1);
      ASSERT_EQ(stopped.size(), 1u) << "rank " << r;
      EXPECT_EQ(stopped[0].step(), kStopAfter);
      EXPECT_TRUE(c.reports(r).Of("finished").empty());
    }
    EXPECT_NE(c.result(2).message().find("preempted by job-9"), std::string::npos) << c.result(2);
    EXPECT_NE(c.result(0).message().find("another rank of the job was asked to stop"),
              std::string::npos)
        << c.result(0);
    EXPECT_TRUE(fs::exists(fs::path(dir_ / "recovered") / "step_00000003"));
    // Trained once each, with the reference's losses.
    const auto first = StepLosses(c.reports(0));
    ASSERT_EQ(first.size(), static_cast<size_t>(kStopAfter));
    for (const auto& [step, loss] : first) EXPECT_EQ(loss, reference.at(step)) << step;
  }
  // Placed again: the job resumes from the saved step, and ends exactly as the
  // uninterrupted run did.
  EpochCluster again(Job(), Dp4(), kFourNodes, 30, (dir_ / "recovered"));
  for (int r = 0; r < kRanks; ++r) again.Launch(again.FirstAssignment(r));
  again.JoinAll();
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_TRUE(again.result(r).ok()) << "rank " << r << ": " << again.result(r);
    const auto resumed = again.reports(r).Of("resumed");
    ASSERT_EQ(resumed.size(), 1u);
    EXPECT_EQ(resumed[0].resumed_step(), kStopAfter);
  }
  const auto rest = StepLosses(again.reports(0));
  ASSERT_EQ(rest.size(), static_cast<size_t>(kSteps - kStopAfter));
  for (const auto& [step, loss] : rest) {
    EXPECT_GT(step, kStopAfter);  // no step recomputed
    EXPECT_EQ(loss, reference.at(step)) << "step " << step;
  }
  ExpectSameCheckpoint((dir_ / "reference"), (dir_ / "recovered"));
}

TEST_F(RankEpochsTest, NoNextAttemptInTimeEndsTheRankWithExitCode4) {
  spec::JobSpec job = Job();
  job.parallelism.dp = 2;
  spec::Layout dp2;
  dp2.dp = 2;
  EpochCluster c(job, dp2, {1, 1}, 2, "");
  for (int r = 0; r < 2; ++r) {
    c.Launch(c.FirstAssignment(r), [r](int, int64_t step) {
      return r == 1 && step == 2 ? absl::InternalError("killed") : absl::OkStatus();
    });
  }
  c.JoinAll();
  const absl::Status s = c.result(0);
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_NE(s.message().find("no EnterEpoch moving on from attempt 1"), std::string::npos) << s;
  EXPECT_EQ(ExitCodeFor(s), kExitCollectiveTimeout);
  EXPECT_EQ(c.reports(0).Of("aborted", 1).size(), 1u);
}

TEST_F(RankEpochsTest, WithoutInPlaceRecoveryAFailureEndsTheRank) {
  spec::JobSpec job = Job();
  job.parallelism.dp = 2;
  job.fault_tolerance.in_place = false;
  spec::Layout dp2;
  dp2.dp = 2;
  EpochCluster c(job, dp2, {1, 1}, 30, "");
  for (int r = 0; r < 2; ++r) {
    c.Launch(c.FirstAssignment(r), [r](int, int64_t step) {
      return r == 1 && step == 2 ? absl::InternalError("killed") : absl::OkStatus();
    });
  }
  c.JoinAll();
  const absl::Status s = c.result(0);
  EXPECT_TRUE(IsAttemptFailure(s)) << s;
  EXPECT_TRUE(c.reports(0).Of("aborted").empty());
  // No snapshots were taken: the step reports carry none.
  for (const auto& p : c.reports(0).Of("step")) EXPECT_FALSE(p.has_snapshots());
}

}  // namespace
}  // namespace loom::trainer
