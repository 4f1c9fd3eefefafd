// Durable means durable (issue 24), through the JobManager on the real SQLite
// store: a write that fails — the database locked by another connection, the
// state directory's file system full — reaches its callers as UNAVAILABLE
// naming the cause and changes nothing, and a coordinator restarted on the
// same state finds exactly what clients were told. No caller waits on the
// store: with every write held at a gate, Cancel and Delete return and are
// answered later, GetJob, ListJobs and WatchJob answer, the liveness tick
// returns; and every write is the persister's.
#include <errno.h>
#include <fcntl.h>
#include <sqlite3.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/notification.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/jobs/sqlite_job_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/coordinator/fake_job_store.h"
#include "tests/coordinator/job_manager_harness.h"

namespace loom::coordinator {
namespace {

using ::testing::HasSubstr;
using loom::v1::JobState;
using testing::kSmallDpSpec;

// A watcher that keeps what it is told.
class Recorder final : public WatchSink {
 public:
  void Push(const loom::v1::WatchJobResponse& update, bool last) override {
    absl::MutexLock lock(&mu_);
    updates_.push_back(update);
    ended_ = ended_ || last;
  }
  std::vector<loom::v1::WatchJobResponse> updates() {
    absl::MutexLock lock(&mu_);
    return updates_;
  }
  bool ended() {
    absl::MutexLock lock(&mu_);
    return ended_;
  }

 private:
  absl::Mutex mu_;
  std::vector<loom::v1::WatchJobResponse> updates_;
  bool ended_ = false;
};

class Durability : public testing::JobManagerHarness {
 protected:
  Durability() : JobManagerHarness("loom_durability") {}

  // Every job the restarted coordinator holds, by id, with its state.
  std::map<std::string, JobState> Restarted() {
    Start();
    std::map<std::string, JobState> jobs;
    auto page = jobs_->List(1000);
    EXPECT_TRUE(page.ok());
    for (const auto& job : page->jobs) jobs[job.id()] = job.state();
    return jobs;
  }
};

// Another connection holds the database's write lock (as the sqlite3 shell
// or a backup can): every write of the coordinator fails after its busy
// timeout.
class WriteLock {
 public:
  explicit WriteLock(const std::string& db) {
    EXPECT_EQ(sqlite3_open(db.c_str(), &db_), SQLITE_OK);
    EXPECT_EQ(sqlite3_exec(db_, "BEGIN EXCLUSIVE;", nullptr, nullptr, nullptr), SQLITE_OK)
        << sqlite3_errmsg(db_);
  }
  ~WriteLock() {
    sqlite3_exec(db_, "ROLLBACK;", nullptr, nullptr, nullptr);
    sqlite3_close(db_);
  }

 private:
  sqlite3* db_ = nullptr;
};

TEST_F(Durability, AFailedWriteChangesNothingAndARestartFindsWhatClientsWereTold) {
  Start({}, {.busy_timeout = absl::Milliseconds(20)});
  auto running = jobs_->Submit(kSmallDpSpec, "job.yaml", "", "alice");
  auto ended = jobs_->Submit(kSmallDpSpec, "job.yaml", "", "alice");
  ASSERT_TRUE(running.ok() && ended.ok());
  ASSERT_TRUE(jobs_->Cancel(ended->id()).ok());
  std::map<std::string, JobState> told = {{running->id(), JobState::PENDING},
                                          {ended->id(), JobState::CANCELLED}};
  {
    WriteLock lock(state_dir() + "/loom.db");
    auto refused = jobs_->Submit(kSmallDpSpec, "job.yaml", "", "alice");
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_THAT(std::string(refused.status().message()), HasSubstr("database is locked"));
    auto cancel = jobs_->Cancel(running->id());
    EXPECT_EQ(cancel.status().code(), absl::StatusCode::kUnavailable) << cancel.status();
    EXPECT_THAT(std::string(cancel.status().message()), HasSubstr("nothing was changed"));
    const absl::Status deleted = jobs_->Delete(ended->id());
    EXPECT_EQ(deleted.code(), absl::StatusCode::kUnavailable) << deleted;
    // Memory is as the store: the cancel was put back, the job not deleted,
    // the submission never entered.
    EXPECT_EQ(jobs_->Get(running->id())->state(), JobState::PENDING);
    EXPECT_TRUE(jobs_->Get(ended->id()).ok());
    EXPECT_EQ(jobs_->List(1000)->jobs.size(), 2u);
  }
  jobs_->WaitIdle();
  EXPECT_TRUE(jobs_->CheckInvariants().ok()) << jobs_->CheckInvariants();
  EXPECT_EQ(Restarted(), told);

  // The lock gone, the same calls go through, and a restart finds them.
  auto cancelled = jobs_->Cancel(running->id());
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), JobState::CANCELLED);
  ASSERT_TRUE(jobs_->Delete(ended->id()).ok());
  EXPECT_EQ(Restarted(), (std::map<std::string, JobState>{{running->id(), JobState::CANCELLED}}));
}

// The state directory on a tiny tmpfs that fills up (root only; skipped
// elsewhere).
class FullDisk : public Durability {
 protected:
  void SetUp() override {
    std::filesystem::create_directories(state_dir());
    if (mount("tmpfs", state_dir().c_str(), "tmpfs", 0, "size=4m") != 0) {
      GTEST_SKIP() << "cannot mount a tmpfs at " << state_dir() << " (" << std::strerror(errno)
                   << "); run the test as root to check a full disk";
    }
    mounted_ = true;
  }
  void TearDown() override {
    jobs_.reset();
    if (mounted_) umount2(state_dir().c_str(), MNT_DETACH);
  }
  // Takes every free byte of the file system; returns the file.
  std::string Fill() {
    const std::string path = state_dir() + "/filler";
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    EXPECT_GE(fd, 0);
    const std::string block(64 * 1024, 'x');
    for (size_t size = block.size(); size > 0;) {
      const ssize_t n = ::write(fd, block.data(), size);
      if (n < 0) {
        if (errno != ENOSPC) ADD_FAILURE() << std::strerror(errno);
        if (size == 1) break;
        size /= 2;  // fill the last pages too
      }
    }
    ::close(fd);
    return path;
  }
  bool mounted_ = false;
};

TEST_F(FullDisk, AFullDiskFailsTheWritesAndARestartFindsWhatClientsWereTold) {
  Start();
  // A large spec: its record needs new pages whatever space SQLite kept.
  const std::string large =
      absl::StrCat(kSmallDpSpec, "# ", std::string(150 * 1024, 'p'), "\n");
  auto kept = jobs_->Submit(large, "job.yaml", "", "alice");
  ASSERT_TRUE(kept.ok()) << kept.status();
  const std::string filler = Fill();
  auto refused = jobs_->Submit(large, "job.yaml", "", "alice");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("full"));
  auto cancel = jobs_->Cancel(kept->id());
  EXPECT_EQ(cancel.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(jobs_->Get(kept->id())->state(), JobState::PENDING);
  EXPECT_EQ(jobs_->List(100)->jobs.size(), 1u);
  jobs_.reset();
  ASSERT_EQ(::unlink(filler.c_str()), 0);
  EXPECT_EQ(Restarted(), (std::map<std::string, JobState>{{kept->id(), JobState::PENDING}}));
}

TEST_F(Durability, NoCallerWaitsOnTheStore) {
  auto sqlite = SqliteJobStore::Open(state_dir());
  ASSERT_TRUE(sqlite.ok());
  auto gated = std::make_unique<testing::GatedJobStore>(*std::move(sqlite));
  testing::GatedJobStore* gate = gated.get();
  StartWith({}, std::move(gated));
  auto node = AddNode("node-a", 4);
  auto a = jobs_->Submit(kSmallDpSpec, "job.yaml", "", "alice");
  auto b = jobs_->Submit(kSmallDpSpec, "job.yaml", "", "alice");
  ASSERT_TRUE(a.ok() && b.ok());
  jobs_->WaitIdle();
  ASSERT_EQ(jobs_->Get(a->id())->state(), JobState::STARTING);
  auto watcher = std::make_shared<Recorder>();
  ASSERT_TRUE(jobs_->Watch(a->id(), watcher).ok());
  const size_t launches = node->messages().size();

  gate->Close();  // every write now takes as long as the test wants
  absl::Notification first, second;
  absl::StatusOr<loom::v1::Job> first_answer, second_answer;
  jobs_->CancelAsync(a->id(), [&](absl::StatusOr<loom::v1::Job> job) {
    first_answer = std::move(job);
    first.Notify();
  });
  jobs_->CancelAsync(a->id(), [&](absl::StatusOr<loom::v1::Job> job) {
    second_answer = std::move(job);
    second.Notify();
  });
  gate->AwaitWaiting();  // the persister is in the cancel's write
  EXPECT_FALSE(first.HasBeenNotified());
  EXPECT_FALSE(second.HasBeenNotified());
  absl::Status refused;
  jobs_->DeleteAsync(b->id(), [&](absl::Status s) { refused = s; });
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);  // b still runs
  // Readers answer, with what is stored.
  EXPECT_EQ(jobs_->Get(a->id())->state(), JobState::STARTING);
  EXPECT_EQ(jobs_->List(10)->jobs.size(), 2u);
  auto late = std::make_shared<Recorder>();
  ASSERT_TRUE(jobs_->Watch(b->id(), late).ok());
  EXPECT_EQ(late->updates().size(), 1u);
  jobs_->CheckHealth(absl::Now());  // the liveness tick returns
  // Nothing acted on the cancel yet: no kill, no event.
  EXPECT_EQ(node->messages().size(), launches);
  EXPECT_FALSE(watcher->ended());

  gate->Open();
  first.WaitForNotification();
  second.WaitForNotification();
  ASSERT_TRUE(first_answer.ok()) << first_answer.status();
  ASSERT_TRUE(second_answer.ok()) << second_answer.status();
  EXPECT_EQ(first_answer->state(), JobState::CANCELLED);
  EXPECT_EQ(second_answer->state(), JobState::CANCELLED);
  jobs_->WaitIdle();
  EXPECT_TRUE(watcher->ended());
  const auto messages = node->messages();
  ASSERT_GT(messages.size(), launches);
  EXPECT_TRUE(messages.back().has_kill());
  // One writer: the persister's thread, not a caller's.
  const std::set<std::thread::id> writers = gate->writers();
  EXPECT_EQ(writers.size(), 1u);
  EXPECT_EQ(writers.count(std::this_thread::get_id()), 0u);
}

TEST_F(Durability, NoLongerLeadingStopsActingAtOnce) {
  Start();
  auto node = AddNode("node-a", 2);
  auto job = jobs_->Submit(kSmallDpSpec, "job.yaml", "", "alice");
  ASSERT_TRUE(job.ok());
  jobs_->WaitIdle();
  const size_t launches = node->messages().size();
  // A token write was fenced: another coordinator leads.
  jobs_->NoLongerLeading(absl::UnavailableError("this coordinator no longer leads"));
  auto cancel = jobs_->Cancel(job->id());
  EXPECT_EQ(cancel.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(cancel.status().message()), HasSubstr("no longer leads"));
  jobs_->OnNodeLost("node-a", "its agent's session ended");
  EXPECT_EQ(jobs_->Submit(kSmallDpSpec, "job.yaml", "", "alice").status().code(),
            absl::StatusCode::kUnavailable);
  jobs_->WaitIdle();
  EXPECT_EQ(node->messages().size(), launches);
  Start();  // what the store holds is what it held
  EXPECT_EQ(jobs_->Get(job->id())->state(), JobState::STARTING);
  EXPECT_EQ(jobs_->List(100)->jobs.size(), 1u);
}

// A running job: two ranks on node-a, ready, with `steps` steps reported.
// These restarts take the whole-job path (in place, a crash would keep the
// survivors), at once.
constexpr char kWholeJobRestarts[] = "fault_tolerance: {restart_backoff_s: 0, in_place: false}\n";

class Restarts : public Durability {
 protected:
  loom::v1::Job Running(int steps, const std::string& spec = kSmallDpSpec) {
    auto job = jobs_->Submit(spec, "job.yaml", "", "alice");
    EXPECT_TRUE(job.ok()) << job.status();
    jobs_->WaitIdle();
    loom::v1::RankProgressBatch batch;
    for (int rank = 0; rank < 2; ++rank) Report(batch, *job, rank, "ready", 0);
    for (int step = 1; step <= steps; ++step) Report(batch, *job, 0, "step", step);
    jobs_->OnRankProgressBatch("node-a", batch);
    jobs_->WaitIdle();
    auto running = jobs_->Get(job->id());
    EXPECT_EQ(running->state(), JobState::RUNNING);
    return *running;
  }
  void Report(loom::v1::RankProgressBatch& batch, const loom::v1::Job& job, int rank,
              const std::string& phase, int64_t step) {
    loom::v1::RankProgress* p = batch.add_reports();
    p->set_job_id(job.id());
    p->set_attempt(job.attempt() == 0 ? 1 : job.attempt());
    p->set_rank(rank);
    p->set_phase(phase);
    p->set_step(step);
    p->set_loss(10.0 - static_cast<double>(step) / 100);
    p->set_time_unix_ms(++clock_ms_);
  }
  loom::v1::RegisterNode Registration(const loom::v1::Job& job, std::vector<int> running) {
    loom::v1::RegisterNode r;
    r.set_node_id("node-a");
    for (int rank : running) {
      loom::v1::RunningRank* rr = r.add_running();
      rr->set_job_id(job.id());
      rr->set_attempt(job.attempt());
      rr->set_rank(rank);
    }
    return r;
  }
  int64_t clock_ms_ = absl::ToUnixMillis(absl::Now());
};

TEST_F(Restarts, AStopIsNotTheNodesFailureAndTheStepsSurviveIt) {
  Start();
  AddNode("node-a", 2);
  // Reports above train.steps are refused (report_bounds.h): a job of 1,000.
  const loom::v1::Job job =
      Running(/*steps=*/300, absl::StrReplaceAll(kSmallDpSpec, {{"steps: 5", "steps: 1000"}}));
  jobs_->Stop();  // SIGTERM
  // The server's shutdown ends the node's session, the liveness tick runs.
  jobs_->OnNodeLost("node-a", "its agent's session ended");
  jobs_->CheckHealth(absl::Now() + absl::Hours(1));
  EXPECT_EQ(jobs_->Cancel(job.id()).status().code(), absl::StatusCode::kUnavailable);

  Start();  // on the same state
  auto after = jobs_->Get(job.id());
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->state(), JobState::RUNNING);
  EXPECT_EQ(after->restarts(), 0);
  EXPECT_EQ(after->attempt(), 1);
  // A late watcher still gets every step from the first.
  auto watcher = std::make_shared<Recorder>();
  ASSERT_TRUE(jobs_->Watch(job.id(), watcher).ok());
  const auto snapshot = watcher->updates().at(0);
  ASSERT_EQ(snapshot.backlog_size(), 300);
  EXPECT_EQ(snapshot.backlog(0).step(), 1);
  EXPECT_EQ(snapshot.backlog(299).step(), 300);

  // The agent registers again with both ranks still running: nothing is
  // killed, and its next reports go on where they were.
  auto channel = AddNode("node-a", 2);
  const loom::v1::RegisterNode registration = Registration(*after, {0, 1});
  jobs_->OnNodeRegistered(registration);
  loom::v1::Heartbeat heartbeat;
  *heartbeat.mutable_running() = registration.running();
  jobs_->OnNodeHeartbeat("node-a", heartbeat);
  loom::v1::RankProgressBatch batch;
  Report(batch, *after, 0, "step", 301);
  jobs_->OnRankProgressBatch("node-a", batch);
  jobs_->WaitIdle();
  EXPECT_TRUE(channel->messages().empty());
  EXPECT_EQ(jobs_->Get(job.id())->last_progress().step(), 301);
  EXPECT_EQ(jobs_->Get(job.id())->state(), JobState::RUNNING);
}

TEST_F(Restarts, ARestartedCoordinatorFinishesTheRecoveryItFinds) {
  Start();
  auto old_channel = AddNode("node-a", 2);
  const loom::v1::Job job = Running(
      /*steps=*/3, absl::StrCat(kSmallDpSpec, kWholeJobRestarts));
  // Rank 1 crashes: RESTARTING is stored and the kill leaves; the
  // coordinator stops before rank 0's exit reaches it.
  loom::v1::RankExited crash;
  crash.set_job_id(job.id());
  crash.set_attempt(1);
  crash.set_rank(1);
  crash.set_signal(9);
  jobs_->OnRankExited("node-a", crash);
  jobs_->WaitIdle();
  ASSERT_EQ(jobs_->Get(job.id())->state(), JobState::RESTARTING);
  ASSERT_TRUE(old_channel->messages().back().has_kill());
  jobs_->Stop();

  Start();
  ASSERT_EQ(jobs_->Get(job.id())->state(), JobState::RESTARTING);
  // The node comes back with rank 0 still running (the kill may never have
  // reached it): it is killed again, and rank 1 counts as exited.
  auto channel = AddNode("node-a", 2);
  jobs_->OnNodeRegistered(Registration(job, {0}));
  jobs_->WaitIdle();
  auto sent = channel->messages();
  ASSERT_EQ(sent.size(), 1u);
  ASSERT_TRUE(sent[0].has_kill());
  EXPECT_EQ(sent[0].kill().attempt(), 1);
  EXPECT_EQ(jobs_->Get(job.id())->state(), JobState::RESTARTING);  // rank 0 still runs
  // Its exit (as the agent reports it) ends the attempt: attempt 2 is placed.
  loom::v1::RankExited killed = crash;
  killed.set_rank(0);
  killed.set_signal(15);
  jobs_->OnRankExited("node-a", killed);
  jobs_->WaitIdle();
  auto after = jobs_->Get(job.id());
  EXPECT_EQ(after->state(), JobState::STARTING);
  EXPECT_EQ(after->attempt(), 2);
  EXPECT_EQ(after->restarts(), 1);  // the crash; the stops added none
  EXPECT_EQ(after->crash_restarts(), 1);
  sent = channel->messages();
  ASSERT_EQ(sent.size(), 3u);
  EXPECT_TRUE(sent[1].has_launch() && sent[2].has_launch());
  EXPECT_EQ(sent[1].launch().assignment().attempt(), 2);
}

TEST_F(Restarts, ANodeThatRegistersWithoutTheRanksOfARestartIsCountedAtOnce) {
  Start();
  AddNode("node-a", 2);
  const loom::v1::Job job = Running(
      /*steps=*/1, absl::StrCat(kSmallDpSpec, kWholeJobRestarts));
  loom::v1::RankExited crash;
  crash.set_job_id(job.id());
  crash.set_attempt(1);
  crash.set_rank(0);
  crash.set_exit_code(1);
  jobs_->OnRankExited("node-a", crash);
  jobs_->WaitIdle();
  jobs_->Stop();
  Start();
  // The agent lists no rank: every rank of the attempt is gone.
  AddNode("node-a", 2);
  jobs_->OnNodeRegistered(Registration(job, {}));
  jobs_->WaitIdle();
  EXPECT_EQ(jobs_->Get(job.id())->state(), JobState::STARTING);
  EXPECT_EQ(jobs_->Get(job.id())->attempt(), 2);
}

}  // namespace
}  // namespace loom::coordinator
