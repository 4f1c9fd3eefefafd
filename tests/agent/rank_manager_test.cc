// RankManager with a shell script standing in for loom-trainer: the rank
// directory and assignment file, the trainer's command line and environment,
// exit reports with log tails, kills by job and attempt, launch failures.
#include "worker/agent/rank_manager.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"
#include "tests/agent/agent_test_util.h"

namespace loom::agent {
namespace {

using testing::ReadFile;
using testing::TempDir;
using testing::WaitForFileContains;

// Collects what the manager reports.
class Reports {
 public:
  RankManager::ExitSink Sink() {
    return [this](loom::v1::RankExited exited) {
      absl::MutexLock lock(&mu_);
      exits_.push_back(std::move(exited));
    };
  }
  std::optional<loom::v1::RankExited> Wait(const std::string& job, int attempt, int rank) {
    absl::MutexLock lock(&mu_);
    auto find = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> const loom::v1::RankExited* {
      for (const auto& e : exits_) {
        if (e.job_id() == job && e.attempt() == attempt && e.rank() == rank) return &e;
      }
      return nullptr;
    };
    auto found = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return find() != nullptr; };
    mu_.AwaitWithTimeout(absl::Condition(&found), absl::Seconds(30));
    if (find() == nullptr) return std::nullopt;
    return *find();
  }
  size_t size() {
    absl::MutexLock lock(&mu_);
    return exits_.size();
  }

 private:
  absl::Mutex mu_;
  std::vector<loom::v1::RankExited> exits_ ABSL_GUARDED_BY(mu_);
};

loom::v1::RankAssignment Assignment(const std::string& job, int attempt, int rank) {
  loom::v1::RankAssignment a;
  a.set_job_id(job);
  a.set_attempt(attempt);
  a.set_rank(rank);
  a.set_world_size(4);
  a.set_spec_yaml("name: t\n");
  a.mutable_coords()->set_dp(rank);
  return a;
}

class RankManagerTest : public ::testing::Test {
 protected:
  void SetUp() override { testing::MakeSubreaper(); }

  // Writes the stand-in trainer and returns manager options that use it.
  RankManagerOptions WithTrainer(const std::string& body) {
    const std::string path = dir_.path() + "/fake-trainer.sh";
    {
      std::ofstream script(path);
      script << "#!/bin/sh\n" << body << "\n";
    }
    chmod(path.c_str(), 0755);
    RankManagerOptions options;
    options.work_dir = dir_.path() + "/work";
    // The agent's endpoint is all a trainer is given to talk to.
    options.agent_socket = "unix:/run/loom/agent.sock";
    options.trainer_path = path;
    options.threads_per_rank = 3;
    options.default_grace = absl::Seconds(30);
    return options;
  }

  TempDir dir_;
  Reports reports_;
};

TEST_F(RankManagerTest, LaunchWritesAssignmentRunsTrainerAndReportsExit) {
  RankManager ranks(WithTrainer("echo \"args: $*\"\necho \"threads $OMP_NUM_THREADS "
                                "$OPENBLAS_NUM_THREADS\"\necho \"cwd $(pwd)\"\n"
                                "i=0; while [ $i -lt 30 ]; do echo \"line $i\"; i=$((i+1)); done\n"
                                "exit 5"),
                    reports_.Sink());
  loom::v1::RankAssignment assignment = Assignment("job-1", 2, 3);
  ASSERT_TRUE(ranks.Launch(assignment).ok());
  std::optional<loom::v1::RankExited> exited = reports_.Wait("job-1", 2, 3);
  ASSERT_TRUE(exited.has_value());

  const std::string rank_dir = dir_.path() + "/work/jobs/job-1/attempt_2/rank_3";
  EXPECT_EQ(ranks.RankDir("job-1", 2, 3), rank_dir);
  EXPECT_EQ(exited->exit_code(), 5);
  EXPECT_EQ(exited->signal(), 0);
  EXPECT_GT(exited->exited_unix_us(), 0);  // where a crash's recovery starts
  EXPECT_EQ(exited->log_path(), rank_dir + "/log.txt");
  // The last 20 lines of the log, the earlier ones left out.
  EXPECT_EQ(exited->log_tail().find("line 9\n"), std::string::npos);
  EXPECT_NE(exited->log_tail().find("line 10\n"), std::string::npos);
  EXPECT_NE(exited->log_tail().find("line 29"), std::string::npos);

  loom::v1::RankAssignment written;
  std::ifstream in(rank_dir + "/assignment.pb", std::ios::binary);
  ASSERT_TRUE(written.ParseFromIstream(&in));
  EXPECT_EQ(written.SerializeAsString(), assignment.SerializeAsString());

  std::string log = ReadFile(rank_dir + "/log.txt");
  // No coordinator address and no certificate: a trainer talks only to its agent.
  EXPECT_NE(log.find("args: --assignment=" + rank_dir + "/assignment.pb --work_dir=" + rank_dir +
                     " --agent_socket=unix:/run/loom/agent.sock\n"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("threads 3 3\n"), std::string::npos) << log;
  EXPECT_NE(log.find("cwd " + rank_dir + "\n"), std::string::npos) << log;
  EXPECT_TRUE(ranks.Running().empty());
}

// A rank's token opens the agent's endpoint from its launch until its exit,
// for that rank's identity only. The trainer here waits for a file before it
// exits, so the check runs while the rank certainly lives.
TEST_F(RankManagerTest, ATokenNamesItsRankFromLaunchUntilExit) {
  const std::string go = dir_.path() + "/go";
  RankManager ranks(WithTrainer("while [ ! -e " + go + " ]; do sleep 0.05; done"),
                    reports_.Sink());
  loom::v1::RankAssignment assignment = Assignment("job-t", 3, 1);
  assignment.set_rank_token("token-of-rank-1");
  assignment.set_store_namespace("job-t/3");
  ASSERT_TRUE(ranks.Launch(assignment).ok());

  std::optional<RankIdentity> rank = ranks.RankForToken("token-of-rank-1");
  ASSERT_TRUE(rank.has_value());
  EXPECT_EQ(rank->job_id, "job-t");
  EXPECT_EQ(rank->attempt, 3);
  EXPECT_EQ(rank->rank, 1);
  EXPECT_EQ(rank->store_namespace, "job-t/3");
  EXPECT_FALSE(ranks.RankForToken("token-of-rank-").has_value());
  EXPECT_FALSE(ranks.RankForToken("").has_value());

  std::ofstream(go).put('x');
  ASSERT_TRUE(reports_.Wait("job-t", 3, 1).has_value());
  EXPECT_FALSE(ranks.RankForToken("token-of-rank-1").has_value());
}

TEST_F(RankManagerTest, GpuRanksSeeOnlyTheirDeviceAndRanksWaitPassively) {
  RankManagerOptions options = WithTrainer(
      "echo \"gpu [${CUDA_VISIBLE_DEVICES-unset}] wait $OMP_WAIT_POLICY\"");
  options.gpu_devices = true;
  RankManager ranks(options, reports_.Sink());
  loom::v1::RankAssignment assignment = Assignment("job-g", 1, 0);
  assignment.set_local_device(5);
  ASSERT_TRUE(ranks.Launch(assignment).ok());
  ASSERT_TRUE(reports_.Wait("job-g", 1, 0).has_value());
  const std::string log = ReadFile(ranks.RankDir("job-g", 1, 0) + "/log.txt");
  EXPECT_NE(log.find("gpu [5] wait PASSIVE"), std::string::npos) << log;

  RankManager cpu_ranks(WithTrainer("echo \"gpu [${CUDA_VISIBLE_DEVICES-unset}]\""),
                        reports_.Sink());
  ASSERT_TRUE(cpu_ranks.Launch(Assignment("job-c", 1, 0)).ok());
  ASSERT_TRUE(reports_.Wait("job-c", 1, 0).has_value());
  EXPECT_NE(ReadFile(cpu_ranks.RankDir("job-c", 1, 0) + "/log.txt").find("gpu [unset]"),
            std::string::npos);
}

TEST_F(RankManagerTest, ReportsSignal) {
  RankManager ranks(WithTrainer("kill -KILL $$"), reports_.Sink());
  ASSERT_TRUE(ranks.Launch(Assignment("j", 1, 0)).ok());
  std::optional<loom::v1::RankExited> exited = reports_.Wait("j", 1, 0);
  ASSERT_TRUE(exited.has_value());
  EXPECT_EQ(exited->signal(), SIGKILL);
}

TEST_F(RankManagerTest, KillMatchesJobAndAttempt) {
  RankManager ranks(WithTrainer("echo ready; exec /bin/sleep 30"), reports_.Sink());
  ASSERT_TRUE(ranks.Launch(Assignment("a", 1, 0)).ok());
  ASSERT_TRUE(ranks.Launch(Assignment("a", 1, 1)).ok());
  ASSERT_TRUE(ranks.Launch(Assignment("a", 2, 0)).ok());
  ASSERT_TRUE(ranks.Launch(Assignment("b", 1, 0)).ok());
  EXPECT_EQ(ranks.Running().size(), 4u);
  for (const auto& rank : ranks.Running()) EXPECT_GT(rank.pid(), 0);

  loom::v1::KillRanks kill;
  kill.set_job_id("a");
  kill.set_attempt(1);
  kill.set_grace_seconds(30);
  EXPECT_EQ(ranks.Kill(kill), 2);
  ASSERT_TRUE(reports_.Wait("a", 1, 0).has_value());
  ASSERT_TRUE(reports_.Wait("a", 1, 1).has_value());
  EXPECT_EQ(reports_.Wait("a", 1, 1)->signal(), SIGTERM);
  std::vector<loom::v1::RunningRank> running = ranks.Running();
  ASSERT_EQ(running.size(), 2u);

  kill.set_attempt(0);  // every attempt of job a
  EXPECT_EQ(ranks.Kill(kill), 1);
  ASSERT_TRUE(reports_.Wait("a", 2, 0).has_value());
  running = ranks.Running();
  ASSERT_EQ(running.size(), 1u);
  EXPECT_EQ(running[0].job_id(), "b");

  ranks.Shutdown(absl::Seconds(30));
  ASSERT_TRUE(reports_.Wait("b", 1, 0).has_value());
  EXPECT_EQ(reports_.size(), 4u);
  EXPECT_EQ(ranks.Launch(Assignment("c", 1, 0)).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(RankManagerTest, KillUsesTheGraceItIsGiven) {
  const std::string ready = dir_.path() + "/work/jobs/a/attempt_1/rank_0/log.txt";
  RankManager ranks(WithTrainer("trap '' TERM; echo ready; while :; do /bin/sleep 0.05; done"),
                    reports_.Sink());
  ASSERT_TRUE(ranks.Launch(Assignment("a", 1, 0)).ok());
  ASSERT_TRUE(WaitForFileContains(ready, "ready"));
  loom::v1::KillRanks kill;
  kill.set_job_id("a");
  kill.set_grace_seconds(0.2);
  EXPECT_EQ(ranks.Kill(kill), 1);
  std::optional<loom::v1::RankExited> exited = reports_.Wait("a", 1, 0);
  ASSERT_TRUE(exited.has_value());
  EXPECT_EQ(exited->signal(), SIGKILL);
}

TEST_F(RankManagerTest, DuplicateLaunchIsIgnored) {
  RankManager ranks(WithTrainer("exec /bin/sleep 30"), reports_.Sink());
  ASSERT_TRUE(ranks.Launch(Assignment("a", 1, 0)).ok());
  EXPECT_EQ(ranks.Launch(Assignment("a", 1, 0)).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(ranks.Running().size(), 1u);
  ranks.Shutdown(absl::Seconds(30));
  EXPECT_EQ(reports_.size(), 1u);
}

TEST_F(RankManagerTest, MissingTrainerIsReportedAsExit127) {
  RankManagerOptions options = WithTrainer("exit 0");
  options.trainer_path = dir_.path() + "/no-trainer";
  RankManager ranks(options, reports_.Sink());
  EXPECT_FALSE(ranks.Launch(Assignment("a", 1, 0)).ok());
  std::optional<loom::v1::RankExited> exited = reports_.Wait("a", 1, 0);
  ASSERT_TRUE(exited.has_value());
  EXPECT_EQ(exited->exit_code(), kLaunchFailedExitCode);
  EXPECT_NE(exited->log_tail().find("no-trainer"), std::string::npos) << exited->log_tail();
  EXPECT_NE(ReadFile(exited->log_path()).find("no-trainer"), std::string::npos);
  EXPECT_TRUE(ranks.Running().empty());
}

TEST_F(RankManagerTest, JobIdThatIsNotADirectoryNameIsRefused) {
  RankManager ranks(WithTrainer("exit 0"), reports_.Sink());
  for (const char* bad : {"../escape", "a/b", "", ".."}) {
    absl::Status status = ranks.Launch(Assignment(bad, 1, 0));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(status.message().find("job_id"), absl::string_view::npos);
  }
  EXPECT_EQ(reports_.size(), 4u);
  EXPECT_FALSE(std::filesystem::exists(dir_.path() + "/escape"));
  EXPECT_TRUE(ValidateJobId("tiny-llama.20240101_7").ok());
}

// Confinement at launch: this node's roots decide, whatever the coordinator sent.
class RankConfinementTest : public RankManagerTest {
 protected:
  RankManagerOptions Confined() {
    RankManagerOptions options = WithTrainer("exit 0");
    data_ = dir_.path() + "/data";
    outside_ = dir_.path() + "/outside";
    std::filesystem::create_directories(data_);
    std::filesystem::create_directories(outside_);
    std::ofstream(data_ + "/train.txt") << "hello";
    std::ofstream(outside_ + "/secret.bin") << "SECRETBYTES";
    options.roots.data_roots = {data_};
    options.roots.checkpoint_root = dir_.path() + "/ckpt";
    return options;
  }
  static loom::v1::RankAssignment WithSpec(loom::v1::RankAssignment a, const std::string& yaml) {
    a.set_spec_yaml(yaml);
    return a;
  }
  std::string data_, outside_;
};

TEST_F(RankConfinementTest, DataOutsideTheRootsIsAJobBrokenExitWithoutTheFileBytes) {
  RankManager ranks(Confined(), reports_.Sink());
  std::filesystem::create_symlink(outside_ + "/secret.bin", data_ + "/link.bin");
  const std::pair<const char*, std::string> cases[] = {
      {"abs", "data: {train_path: " + outside_ + "/secret.bin}\n"},
      {"dots", "data: {train_path: ../outside/secret.bin}\n"},
      {"link", "data: {train_path: " + data_ + "/link.bin}\n"}};
  for (const auto& [job, yaml] : cases) {
    EXPECT_FALSE(ranks.Launch(WithSpec(Assignment(job, 1, 0), "name: t\n" + yaml)).ok()) << job;
    std::optional<loom::v1::RankExited> exited = reports_.Wait(job, 1, 0);
    ASSERT_TRUE(exited.has_value()) << job;
    EXPECT_EQ(exited->exit_code(), 3) << job;  // job broken: no restart helps
    EXPECT_NE(exited->log_tail().find("data.train_path"), std::string::npos) << exited->log_tail();
    EXPECT_EQ(exited->log_tail().find("SECRET"), std::string::npos) << exited->log_tail();
  }
}

TEST_F(RankConfinementTest, DataAndCheckpointsAreRewrittenForThisNode) {
  RankManager ranks(Confined(), reports_.Sink());
  loom::v1::RankAssignment a = WithSpec(Assignment("job-7", 1, 0),
                                        "name: t\ndata: {train_path: train.txt}\n"
                                        "checkpoint: {dir: c}\n");
  a.set_owner("alice");
  a.set_checkpoint_dir("/somewhere/else/victim");  // what a coordinator sent; not trusted
  ASSERT_TRUE(ranks.Launch(a).ok());
  ASSERT_TRUE(reports_.Wait("job-7", 1, 0).has_value());
  loom::v1::RankAssignment written;
  std::ifstream in(ranks.RankDir("job-7", 1, 0) + "/assignment.pb", std::ios::binary);
  ASSERT_TRUE(written.ParseFromIstream(&in));
  EXPECT_EQ(written.checkpoint_dir(), dir_.path() + "/ckpt/alice/job-7");
  EXPECT_NE(written.spec_yaml().find(std::filesystem::canonical(data_ + "/train.txt").string()),
            std::string::npos)
      << written.spec_yaml();
  struct stat st;
  ASSERT_EQ(stat(written.checkpoint_dir().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(stat(ranks.RankDir("job-7", 1, 0).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
}

TEST_F(RankConfinementTest, RanksRunAsTheGivenUserAndOwnTheirDirectories) {
  if (geteuid() != 0) GTEST_SKIP() << "switching users needs root";
  RankManagerOptions options = Confined();
  options = WithTrainer("echo \"uid=$(id -u)\"; test -r assignment.pb && echo readable; "
                        "test -w . && echo writable; ls");
  options.roots.data_roots = {data_};
  options.roots.checkpoint_root = dir_.path() + "/ckpt";
  options.run_as = {65534, 65534};
  options.roots.rank_owner = options.run_as;
  chmod(dir_.path().c_str(), 0755);  // the stand-in trainer lives here
  RankManager ranks(options, reports_.Sink());
  loom::v1::RankAssignment a = WithSpec(Assignment("job-9", 1, 0), "name: t\ncheckpoint: {dir: c}\n");
  a.set_checkpoint_dir("x");
  ASSERT_TRUE(ranks.Launch(a).ok());
  std::optional<loom::v1::RankExited> exited = reports_.Wait("job-9", 1, 0);
  ASSERT_TRUE(exited.has_value());
  const std::string log = ReadFile(exited->log_path());
  EXPECT_NE(log.find("uid=65534\nreadable\nwritable\n"), std::string::npos) << log;
  // The rank holds no copy of the node's certificate or key (it has none to use).
  EXPECT_EQ(log.find(".key"), std::string::npos) << log;
  EXPECT_EQ(log.find(".crt"), std::string::npos) << log;
  struct stat st;
  ASSERT_EQ(stat(ranks.RankDir("job-9", 1, 0).c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 65534u);
  ASSERT_EQ(stat((dir_.path() + "/ckpt/default/job-9").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 65534u);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(stat((dir_.path() + "/work/jobs/job-9").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 0u);  // above the rank's own directory: the agent's, traverse only
  EXPECT_EQ(st.st_mode & 0777, 0711u);
}

TEST_F(RankConfinementTest, AReusedRankDirectoryWithAPlantedSymlinkIsRefused) {
  RankManager ranks(Confined(), reports_.Sink());
  const std::string dir = ranks.RankDir("job-8", 1, 0);
  std::filesystem::create_directories(dir);
  std::filesystem::create_symlink(outside_ + "/secret.bin", dir + "/log.txt");
  EXPECT_FALSE(ranks.Launch(Assignment("job-8", 1, 0)).ok());
  ASSERT_TRUE(reports_.Wait("job-8", 1, 0).has_value());
  EXPECT_EQ(ReadFile(outside_ + "/secret.bin"), "SECRETBYTES");  // neither truncated nor appended
}

}  // namespace
}  // namespace loom::agent

namespace loom::agent {
namespace {

// ReadRankLog: a running rank's log by its key; an ended one's from the
// newest launch directory at or before the attempt (a survivor moved into a
// later attempt keeps the directory it was launched in).
TEST_F(RankManagerTest, ReadLogFindsRunningAndEndedRanksLogs) {
  RankManager ranks(WithTrainer("echo running-rank-line\nsleep 30"), reports_.Sink());
  ASSERT_TRUE(ranks.Launch(Assignment("job-2", 1, 0)).ok());
  loom::v1::ReadRankLog request;
  request.set_job_id("job-2");
  request.set_attempt(1);
  request.set_rank(0);
  request.set_max_bytes(1 << 20);  // capped at 64 KiB by the agent
  ASSERT_TRUE(WaitForFileContains(ranks.RankDir("job-2", 1, 0) + "/log.txt",
                                             "running-rank-line"));
  loom::v1::RankLogChunk running = ranks.ReadLog(request);
  EXPECT_EQ(running.error_code(), 0) << running.error();
  EXPECT_TRUE(running.running());
  EXPECT_NE(running.data().find("running-rank-line"), std::string::npos);

  // A rank that ended in attempt 1 and survived into attempt 3 (no
  // directory of its own there): found in attempt_1, not running.
  const std::string old_dir = ranks.RankDir("job-2", 1, 5);
  std::filesystem::create_directories(old_dir);
  std::ofstream(old_dir + "/log.txt") << "from attempt one\n";
  request.set_rank(5);
  request.set_attempt(3);
  request.set_offset(5);
  loom::v1::RankLogChunk ended = ranks.ReadLog(request);
  EXPECT_EQ(ended.error_code(), 0) << ended.error();
  EXPECT_FALSE(ended.running());
  EXPECT_EQ(ended.data(), "attempt one\n");
  EXPECT_EQ(ended.offset(), 5);
  EXPECT_EQ(ended.file_size(), 17);

  request.set_rank(6);
  EXPECT_EQ(ranks.ReadLog(request).error_code(), static_cast<int>(absl::StatusCode::kNotFound));
  request.set_job_id("../etc");
  EXPECT_EQ(ranks.ReadLog(request).error_code(),
            static_cast<int>(absl::StatusCode::kInvalidArgument));
  loom::v1::KillRanks kill;
  kill.set_job_id("job-2");
  kill.set_grace_seconds(0.1);
  ranks.Kill(kill);
  ASSERT_TRUE(reports_.Wait("job-2", 1, 0).has_value());
}

}  // namespace
}  // namespace loom::agent
