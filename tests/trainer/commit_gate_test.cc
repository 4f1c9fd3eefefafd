// The commit gate (worker/trainer/commit_gate.h) and what a checkpoint save
// does with its answers (engine::SaveDistributedStep): an add in the
// attempt's namespace lets the commit happen; a refusal (the namespace is
// gone: the attempt is superseded) abandons the step on every rank, leaving
// nothing behind, and fails as PERMISSION_DENIED (exit code 5); UNAVAILABLE
// is retried with backoff, and past the bound the step is skipped with a log
// line while training goes on.
#include "worker/trainer/commit_gate.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "common/exit_codes.h"
#include "tests/comm/rank_harness.h"
#include "tests/engine/test_util.h"
#include "worker/comm/in_process_store.h"
#include "worker/engine/training_loop.h"
#include "worker/trainer/standalone.h"

namespace loom::trainer {
namespace {

namespace fs = std::filesystem;

// The attempt's store as the agent relays it: its adds fail with `failure`
// for the first `failures` calls (a coordinator that is away, a namespace
// that was dropped), then reach the real store.
class FlakyStore : public comm::Store {
 public:
  FlakyStore(absl::Status failure, int failures) : failure_(std::move(failure)), left_(failures) {}
  absl::Status Set(const std::string& k, const std::string& v) override { return real_.Set(k, v); }
  absl::StatusOr<std::string> Get(const std::string& k, absl::Duration t) override {
    return real_.Get(k, t);
  }
  absl::StatusOr<int64_t> Add(const std::string& k, int64_t d) override {
    ++calls_;
    if (left_ != 0) {
      if (left_ > 0) --left_;
      return failure_;
    }
    return real_.Add(k, d);
  }
  int calls() const { return calls_; }
  comm::InProcessStore& real() { return real_; }

 private:
  comm::InProcessStore real_;
  absl::Status failure_;
  int left_;  // -1: always
  int calls_ = 0;
};

CommitGateOptions Fast() {
  CommitGateOptions o;
  o.retry_for = absl::Milliseconds(300);
  o.first_backoff = absl::Milliseconds(10);
  o.max_backoff = absl::Milliseconds(40);
  return o;
}

TEST(CommitGateTest, AddsTheCommitKeyAndRetriesThroughUnavailable) {
  FlakyStore store(absl::UnavailableError("coordinator restarting"), 3);
  std::vector<std::string> events;
  engine::CommitGate gate =
      MakeStoreCommitGate(&store, Fast(), [&](const std::string& e) { events.push_back(e); });
  EXPECT_TRUE(gate(12).ok());
  EXPECT_EQ(store.calls(), 4);
  EXPECT_TRUE(store.real().Get("loom/commit/12", absl::Seconds(1)).ok());
  EXPECT_TRUE(events.empty());
}

TEST(CommitGateTest, StaysUnavailablePastItsBoundAndSaysTheStepIsSkipped) {
  FlakyStore store(absl::UnavailableError("waiting for node-b's lease"), -1);
  std::vector<std::string> events;
  engine::CommitGate gate =
      MakeStoreCommitGate(&store, Fast(), [&](const std::string& e) { events.push_back(e); });
  absl::Status s = gate(12);
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_GT(store.calls(), 1);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_NE(events[0].find("checkpoint of step 12 skipped"), std::string::npos) << events[0];
  EXPECT_NE(events[0].find("loom/commit/12"), std::string::npos) << events[0];
}

TEST(CommitGateTest, ARefusalIsNotRetried) {
  FlakyStore store(absl::NotFoundError("rendezvous namespace job/attempt-1 is gone"), -1);
  engine::CommitGate gate = MakeStoreCommitGate(&store, Fast(), {});
  absl::Status s = gate(12);
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_EQ(store.calls(), 1);
}

class CommitGateSaveTest : public ::testing::Test {
 protected:
  void SetUp() override { engine::testing::WriteTinyCorpus(dir_); }

  spec::JobSpec Job() const {
    spec::JobSpec job = engine::testing::TinyJob(dir_ / "train.txt", "");
    job.train.steps = 2;
    return job;
  }
  // Nothing of a step may be left in the root: no step, no temporary.
  static std::vector<std::string> Entries(const fs::path& root) {
    std::vector<std::string> out;
    if (!fs::exists(root)) return out;
    for (const auto& e : fs::directory_iterator(root)) out.push_back(e.path().filename().string());
    return out;
  }

  engine::testing::ScratchDir dir_;
};

TEST_F(CommitGateSaveTest, EveryRankAbandonsTheStepWhenTheGateRefuses) {
  spec::JobSpec job = Job();
  job.parallelism.dp = 2;
  comm::InProcessStore groups;
  auto dp = comm::testing::MakeGroup(groups, 2, absl::Seconds(30), "dp");
  FlakyStore attempt_store(absl::NotFoundError("rendezvous namespace job/attempt-1 is gone"), -1);
  const fs::path root = dir_ / "ckpt";
  std::vector<absl::StatusOr<std::string>> saved(2, std::string());
  comm::testing::RunRanks(dp, [&](int r, comm::Communicator& c) {
    auto loop = engine::TrainingLoop::Create(job, r, 2, &c);
    ASSERT_TRUE(loop.ok()) << loop.status();
    // Only the committing rank asks; every rank has one, as in a real job.
    (*loop)->set_commit_gate(MakeStoreCommitGate(&attempt_store, Fast(), {}));
    ASSERT_TRUE((*loop)->TrainStep().ok());
    saved[static_cast<size_t>(r)] = (*loop)->SaveCheckpoint(root.string());
  });
  for (int r = 0; r < 2; ++r) {
    const absl::Status s = saved[static_cast<size_t>(r)].status();
    EXPECT_TRUE(absl::IsPermissionDenied(s)) << "rank " << r << ": " << s;
    EXPECT_NE(s.message().find("checkpoint of step 1 abandoned"), std::string::npos) << s;
    EXPECT_EQ(ExitCodeFor(s), kExitFenced);
  }
  EXPECT_NE(saved[0].status().message().find("job/attempt-1 is gone"), std::string::npos);
  EXPECT_EQ(attempt_store.calls(), 1);
  EXPECT_TRUE(Entries(root).empty()) << Entries(root).front();
}

TEST_F(CommitGateSaveTest, AnUnavailableGateSkipsTheStepAndAnOpenOneCommitsIt) {
  const fs::path root = dir_ / "ckpt";
  auto loop = engine::TrainingLoop::Create(Job());
  ASSERT_TRUE(loop.ok());
  FlakyStore away(absl::UnavailableError("coordinator away"), -1);
  std::vector<std::string> events;
  (*loop)->set_commit_gate(
      MakeStoreCommitGate(&away, Fast(), [&](const std::string& e) { events.push_back(e); }));
  ASSERT_TRUE((*loop)->TrainStep().ok());
  absl::StatusOr<std::string> skipped = (*loop)->SaveCheckpoint(root.string());
  ASSERT_TRUE(skipped.ok()) << skipped.status();
  EXPECT_EQ(*skipped, "");
  EXPECT_EQ(events.size(), 1u);
  EXPECT_TRUE(Entries(root).empty());
  // Training goes on, and the next checkpoint commits once the gate answers.
  FlakyStore open(absl::OkStatus(), 0);
  (*loop)->set_commit_gate(MakeStoreCommitGate(&open, Fast(), {}));
  ASSERT_TRUE((*loop)->TrainStep().ok());
  absl::StatusOr<std::string> committed = (*loop)->SaveCheckpoint(root.string());
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_EQ(fs::path(*committed).filename(), "step_00000002");
  EXPECT_TRUE(open.real().Get("loom/commit/2", absl::Seconds(1)).ok());
  EXPECT_EQ(Entries(root), std::vector<std::string>{"step_00000002"});
}

}  // namespace
}  // namespace loom::trainer
