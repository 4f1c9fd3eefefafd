// ProcessSupervisor with /bin/sh and /bin/sleep children: exit codes,
// signals, logs and environment, kills with a grace period, process-group
// clean-up, PDEATHSIG when the supervising process is SIGKILLed, and
// pausing (SIGSTOP/SIGCONT to the group; a stopped child is killed at once).
#include "worker/agent/process_supervisor.h"

#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>

#include "gtest/gtest.h"
#include "tests/agent/agent_test_util.h"

namespace loom::agent {
namespace {

using testing::ExitCollector;
using testing::KillAndReap;
using testing::ReadFile;
using testing::TempDir;
using testing::WaitForFileContains;
using testing::WaitForPid;
using testing::WaitGone;

ProcessSpec Shell(const std::string& script, const std::string& log_path = "") {
  ProcessSpec spec;
  spec.argv = {"/bin/sh", "-c", script};
  spec.log_path = log_path;
  return spec;
}

class ProcessSupervisorTest : public ::testing::Test {
 protected:
  void SetUp() override { testing::MakeSubreaper(); }
  TempDir dir_;
  ExitCollector exits_;
};

TEST_F(ProcessSupervisorTest, ReportsExitCode) {
  ProcessSupervisor supervisor;
  absl::StatusOr<pid_t> pid = supervisor.Launch(Shell("exit 3"), exits_.Callback());
  ASSERT_TRUE(pid.ok()) << pid.status();
  std::optional<ProcessExit> exit = exits_.Wait(*pid);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->pid, *pid);
  EXPECT_EQ(exit->exit_code, 3);
  EXPECT_EQ(exit->signal, 0);
  EXPECT_EQ(DescribeExit(*exit), "exit code 3");
  EXPECT_TRUE(supervisor.Running().empty());
}

TEST_F(ProcessSupervisorTest, AnExistingLogOrAPlantedSymlinkIsRefused) {
  ProcessSupervisor supervisor;
  const std::string target = dir_.path() + "/victim.txt";
  {
    std::ofstream(target) << "keep";
  }
  std::filesystem::create_symlink(target, dir_.path() + "/log.txt");
  absl::StatusOr<pid_t> pid =
      supervisor.Launch(Shell("echo overwritten", dir_.path() + "/log.txt"), exits_.Callback());
  EXPECT_FALSE(pid.ok());
  EXPECT_EQ(ReadFile(target), "keep");
  EXPECT_FALSE(supervisor.Launch(Shell("exit 0", target), exits_.Callback()).ok());
  EXPECT_EQ(ReadFile(target), "keep");
}

TEST_F(ProcessSupervisorTest, ChildRunsAsTheGivenUser) {
  if (geteuid() != 0) GTEST_SKIP() << "switching users needs root";
  ProcessSupervisor supervisor;
  const std::string log = dir_.path() + "/log.txt";
  ProcessSpec spec = Shell("echo \"uid=$(id -u) gid=$(id -g) groups=$(id -G)\"", log);
  spec.uid = 65534;
  spec.gid = 65534;
  absl::StatusOr<pid_t> pid = supervisor.Launch(spec, exits_.Callback());
  ASSERT_TRUE(pid.ok()) << pid.status();
  std::optional<ProcessExit> exit = exits_.Wait(*pid);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit_code, 0);
  EXPECT_NE(ReadFile(log).find("uid=65534 gid=65534 groups=65534\n"), std::string::npos)
      << ReadFile(log);
}

TEST_F(ProcessSupervisorTest, ChildGetsExactlyTheGivenSupplementaryGroups) {
  if (geteuid() != 0) GTEST_SKIP() << "switching users needs root";
  ProcessSupervisor supervisor;
  const std::string log = dir_.path() + "/log.txt";
  ProcessSpec spec = Shell("echo \"uid=$(id -u) gid=$(id -g) groups=$(id -G)\"", log);
  spec.uid = 3100007;  // a per-job uid: no passwd entry needed
  spec.gid = 3100007;
  spec.groups = {3100002};
  absl::StatusOr<pid_t> pid = supervisor.Launch(spec, exits_.Callback());
  ASSERT_TRUE(pid.ok()) << pid.status();
  std::optional<ProcessExit> exit = exits_.Wait(*pid);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit_code, 0);
  EXPECT_NE(ReadFile(log).find("uid=3100007 gid=3100007 groups=3100007 3100002\n"),
            std::string::npos)
      << ReadFile(log);
}

TEST_F(ProcessSupervisorTest, ReportsTheSignalThatEndedTheChild) {
  ProcessSupervisor supervisor;
  absl::StatusOr<pid_t> pid = supervisor.Launch(Shell("kill -SEGV $$"), exits_.Callback());
  ASSERT_TRUE(pid.ok()) << pid.status();
  std::optional<ProcessExit> exit = exits_.Wait(*pid);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->signal, SIGSEGV);
  EXPECT_EQ(DescribeExit(*exit), "signal 11 (SIGSEGV)");
}

TEST_F(ProcessSupervisorTest, LogGetsStdoutAndStderrAndChildGetsEnvAndDirectory) {
  ProcessSupervisor supervisor;
  const std::string log = dir_.path() + "/log.txt";
  ProcessSpec spec = Shell("echo to-out; echo to-err >&2; echo \"thr=$OMP_NUM_THREADS\"; pwd", log);
  spec.env = {{"OMP_NUM_THREADS", "7"}};
  spec.working_dir = dir_.path();
  absl::StatusOr<pid_t> pid = supervisor.Launch(spec, exits_.Callback());
  ASSERT_TRUE(pid.ok()) << pid.status();
  ASSERT_TRUE(exits_.Wait(*pid).has_value());
  std::string text = ReadFile(log);
  EXPECT_NE(text.find("to-out\n"), std::string::npos) << text;
  EXPECT_NE(text.find("to-err\n"), std::string::npos) << text;
  EXPECT_NE(text.find("thr=7\n"), std::string::npos) << text;
  EXPECT_NE(text.find(dir_.path() + "\n"), std::string::npos) << text;
}

TEST_F(ProcessSupervisorTest, ChildStartsWithCleanSignalStateAndOwnGroup) {
  // Blocked and ignored signals survive exec; a rank must not inherit the
  // agent's.
  sigset_t block;
  sigemptyset(&block);
  sigaddset(&block, SIGTERM);
  sigset_t old_mask;
  pthread_sigmask(SIG_BLOCK, &block, &old_mask);
  struct sigaction ignore = {}, old_pipe = {};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &ignore, &old_pipe);
  auto supervisor = std::make_unique<ProcessSupervisor>();  // its thread inherits the mask
  pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  sigaction(SIGPIPE, &old_pipe, nullptr);

  const std::string log = dir_.path() + "/log.txt";
  absl::StatusOr<pid_t> pid =
      supervisor->Launch(Shell("echo ready; exec /bin/sleep 30", log), exits_.Callback());
  ASSERT_TRUE(pid.ok()) << pid.status();
  ASSERT_TRUE(WaitForFileContains(log, "ready"));
  std::string status = ReadFile("/proc/" + std::to_string(*pid) + "/status");
  EXPECT_NE(status.find("SigBlk:\t0000000000000000"), std::string::npos) << status;
  EXPECT_NE(status.find("SigIgn:\t0000000000000000"), std::string::npos) << status;
  EXPECT_EQ(getpgid(*pid), *pid);
  ASSERT_TRUE(supervisor->Kill(*pid, absl::Seconds(30)).ok());
  std::optional<ProcessExit> exit = exits_.Wait(*pid);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->signal, SIGTERM);
}

TEST_F(ProcessSupervisorTest, KillIgnoringTermIsKilledAfterGrace) {
  ProcessSupervisor supervisor;
  const std::string log = dir_.path() + "/log.txt";
  absl::StatusOr<pid_t> pid = supervisor.Launch(
      Shell("trap '' TERM; echo ready; while :; do /bin/sleep 0.05; done", log),
      exits_.Callback());
  ASSERT_TRUE(pid.ok()) << pid.status();
  ASSERT_TRUE(WaitForFileContains(log, "ready"));
  ASSERT_TRUE(supervisor.Kill(*pid, absl::Milliseconds(200)).ok());
  std::optional<ProcessExit> exit = exits_.Wait(*pid);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->signal, SIGKILL);
}

TEST_F(ProcessSupervisorTest, KillWithGraceEndsCooperativeChildWithTerm) {
  ProcessSupervisor supervisor;
  absl::StatusOr<pid_t> pid = supervisor.Launch(
      ProcessSpec{{"/bin/sleep", "30"}, {}, "", ""}, exits_.Callback());
  ASSERT_TRUE(pid.ok()) << pid.status();
  ASSERT_TRUE(supervisor.Kill(*pid, absl::Seconds(30)).ok());
  std::optional<ProcessExit> exit = exits_.Wait(*pid);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->signal, SIGTERM);
}

TEST_F(ProcessSupervisorTest, KillReachesTheWholeGroup) {
  ProcessSupervisor supervisor;
  const std::string log = dir_.path() + "/log.txt";
  absl::StatusOr<pid_t> pid = supervisor.Launch(
      Shell("/bin/sleep 30 & echo \"bg $!\"; wait", log), exits_.Callback());
  ASSERT_TRUE(pid.ok()) << pid.status();
  pid_t background = WaitForPid(log, "bg ");
  ASSERT_GT(background, 0);
  ASSERT_TRUE(supervisor.Kill(*pid, absl::ZeroDuration()).ok());
  std::optional<ProcessExit> exit = exits_.Wait(*pid);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->signal, SIGKILL);
  testing::GoneResult gone = WaitGone(background);
  EXPECT_TRUE(gone.gone);
  if (!gone.gone) KillAndReap(background);
}

TEST_F(ProcessSupervisorTest, LeftoversOfAnExitedChildAreKilled) {
  ProcessSupervisor supervisor;
  const std::string log = dir_.path() + "/log.txt";
  absl::StatusOr<pid_t> pid =
      supervisor.Launch(Shell("/bin/sleep 30 & echo \"bg $!\"; exit 0", log), exits_.Callback());
  ASSERT_TRUE(pid.ok()) << pid.status();
  std::optional<ProcessExit> exit = exits_.Wait(*pid);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit_code, 0);
  pid_t background = WaitForPid(log, "bg ");
  ASSERT_GT(background, 0);
  testing::GoneResult gone = WaitGone(background);
  EXPECT_TRUE(gone.gone);
  if (!gone.gone) KillAndReap(background);
}

TEST_F(ProcessSupervisorTest, ChildrenDieWhenTheSupervisingProcessIsKilled) {
  ProcessSupervisor supervisor;
  const std::string log = dir_.path() + "/helper.txt";
  ProcessSpec spec{{LOOM_AGENT_SUPERVISOR_HELPER, "/bin/sleep", "60"}, {}, log, ""};
  absl::StatusOr<pid_t> helper = supervisor.Launch(spec, exits_.Callback());
  ASSERT_TRUE(helper.ok()) << helper.status();
  pid_t grandchild = WaitForPid(log, "child ");
  ASSERT_GT(grandchild, 0) << ReadFile(log);
  EXPECT_NE(testing::ProcState(grandchild), 0);  // running before

  kill(*helper, SIGKILL);
  std::optional<ProcessExit> exit = exits_.Wait(*helper);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->signal, SIGKILL);
  // Orphaned onto this process (a subreaper), so it is reaped here and its
  // cause of death is visible.
  testing::GoneResult gone = WaitGone(grandchild);
  if (!gone.gone) KillAndReap(grandchild);
  ASSERT_TRUE(gone.gone);
  if (gone.reaped_status.has_value()) {
    EXPECT_TRUE(WIFSIGNALED(*gone.reaped_status));
    EXPECT_EQ(WTERMSIG(*gone.reaped_status), SIGKILL);
  }
}

TEST_F(ProcessSupervisorTest, KillAllStopsEveryChild) {
  ProcessSupervisor supervisor;
  std::vector<pid_t> pids;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<pid_t> pid =
        supervisor.Launch(ProcessSpec{{"/bin/sleep", "30"}, {}, "", ""}, exits_.Callback());
    ASSERT_TRUE(pid.ok()) << pid.status();
    pids.push_back(*pid);
  }
  EXPECT_EQ(supervisor.Running().size(), 3u);
  supervisor.KillAll(absl::Seconds(30));
  EXPECT_TRUE(supervisor.Running().empty());
  EXPECT_EQ(exits_.size(), 3u);  // every callback ran before KillAll returned
  for (pid_t pid : pids) EXPECT_EQ(kill(pid, 0), -1);
}

TEST_F(ProcessSupervisorTest, DestructorKillsWhatIsLeft) {
  pid_t pid = 0;
  {
    ProcessSupervisor supervisor(absl::Seconds(30));
    absl::StatusOr<pid_t> launched =
        supervisor.Launch(ProcessSpec{{"/bin/sleep", "30"}, {}, "", ""}, exits_.Callback());
    ASSERT_TRUE(launched.ok()) << launched.status();
    pid = *launched;
  }
  std::optional<ProcessExit> exit = exits_.Wait(pid, absl::ZeroDuration());
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->signal, SIGTERM);
  EXPECT_EQ(kill(pid, 0), -1);  // reaped by the supervisor
}

TEST_F(ProcessSupervisorTest, LaunchFailuresStartNothing) {
  ProcessSupervisor supervisor;
  absl::StatusOr<pid_t> missing = supervisor.Launch(
      ProcessSpec{{dir_.path() + "/no-such-program"}, {}, "", ""}, exits_.Callback());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(missing.status().message().find("no-such-program"), absl::string_view::npos);

  absl::StatusOr<pid_t> bad_log =
      supervisor.Launch(Shell("exit 0", dir_.path() + "/missing-dir/log.txt"), exits_.Callback());
  EXPECT_EQ(bad_log.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(bad_log.status().message().find("missing-dir/log.txt"), absl::string_view::npos);

  EXPECT_EQ(supervisor.Launch(ProcessSpec{}, exits_.Callback()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(supervisor.Running().empty());
  EXPECT_EQ(exits_.size(), 0u);
}

TEST_F(ProcessSupervisorTest, BadWorkingDirectoryIsReportedInTheLog) {
  ProcessSupervisor supervisor;
  const std::string log = dir_.path() + "/log.txt";
  ProcessSpec spec = Shell("exit 0", log);
  spec.working_dir = dir_.path() + "/nowhere";
  absl::StatusOr<pid_t> pid = supervisor.Launch(spec, exits_.Callback());
  ASSERT_TRUE(pid.ok()) << pid.status();
  std::optional<ProcessExit> exit = exits_.Wait(*pid);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit_code, 127);
  EXPECT_NE(ReadFile(log).find("cannot enter working directory"), std::string::npos);
}

TEST_F(ProcessSupervisorTest, StopAndContinueReachTheWholeGroup) {
  ProcessSupervisor supervisor;
  const std::string log = dir_.path() + "/log.txt";
  absl::StatusOr<pid_t> pid = supervisor.Launch(
      Shell("/bin/sleep 30 & echo \"bg $!\"; wait", log), exits_.Callback());
  ASSERT_TRUE(pid.ok()) << pid.status();
  pid_t background = WaitForPid(log, "bg ");
  ASSERT_GT(background, 0);
  ASSERT_TRUE(supervisor.Signal(*pid, SIGSTOP).ok());
  EXPECT_TRUE(testing::WaitStopped(*pid, true));
  EXPECT_TRUE(testing::WaitStopped(background, true));
  ASSERT_TRUE(supervisor.Signal(*pid, SIGCONT).ok());
  EXPECT_TRUE(testing::WaitStopped(*pid, false));
  EXPECT_TRUE(testing::WaitStopped(background, false));
  // A stopped child is not an exit: it is still running.
  EXPECT_EQ(supervisor.Running(), std::vector<pid_t>{*pid});
  EXPECT_EQ(exits_.size(), 0u);
  ASSERT_TRUE(supervisor.Kill(*pid, absl::ZeroDuration()).ok());
  ASSERT_TRUE(exits_.Wait(*pid).has_value());
  testing::GoneResult gone = WaitGone(background);
  EXPECT_TRUE(gone.gone);
  if (!gone.gone) KillAndReap(background);
}

TEST_F(ProcessSupervisorTest, AStoppedChildIsKilledAtOnceWhateverTheGrace) {
  ProcessSupervisor supervisor;
  absl::StatusOr<pid_t> pid = supervisor.Launch(
      ProcessSpec{{"/bin/sleep", "300"}, {}, "", ""}, exits_.Callback());
  ASSERT_TRUE(pid.ok()) << pid.status();
  ASSERT_TRUE(supervisor.Signal(*pid, SIGSTOP).ok());
  ASSERT_TRUE(testing::WaitStopped(*pid, true));
  // Its SIGTERM would wait for a SIGCONT that must not come: SIGKILL now,
  // not after the hour of grace.
  ASSERT_TRUE(supervisor.Kill(*pid, absl::Hours(1)).ok());
  std::optional<ProcessExit> exit = exits_.Wait(*pid);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->signal, SIGKILL);
}

TEST_F(ProcessSupervisorTest, AChildStoppedDuringItsGraceIsKilledAtOnce) {
  ProcessSupervisor supervisor;
  const std::string log = dir_.path() + "/log.txt";
  absl::StatusOr<pid_t> pid = supervisor.Launch(
      Shell("trap '' TERM; echo ready; while :; do /bin/sleep 0.05; done", log),
      exits_.Callback());
  ASSERT_TRUE(pid.ok()) << pid.status();
  ASSERT_TRUE(WaitForFileContains(log, "ready"));
  ASSERT_TRUE(supervisor.Kill(*pid, absl::Hours(1)).ok());
  ASSERT_TRUE(supervisor.Signal(*pid, SIGSTOP).ok());
  std::optional<ProcessExit> exit = exits_.Wait(*pid);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->signal, SIGKILL);
}

TEST_F(ProcessSupervisorTest, SignalTakesOnlyStopAndContinueOfItsOwnChildren) {
  ProcessSupervisor supervisor;
  EXPECT_EQ(supervisor.Signal(getpid(), SIGSTOP).code(), absl::StatusCode::kNotFound);
  absl::StatusOr<pid_t> pid = supervisor.Launch(
      ProcessSpec{{"/bin/sleep", "30"}, {}, "", ""}, exits_.Callback());
  ASSERT_TRUE(pid.ok()) << pid.status();
  EXPECT_EQ(supervisor.Signal(*pid, SIGTERM).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(supervisor.Kill(*pid, absl::ZeroDuration()).ok());
  ASSERT_TRUE(exits_.Wait(*pid).has_value());
}

TEST_F(ProcessSupervisorTest, KillOfUnknownPidIsNotFound) {
  ProcessSupervisor supervisor;
  EXPECT_EQ(supervisor.Kill(getpid(), absl::ZeroDuration()).code(), absl::StatusCode::kNotFound);
  absl::StatusOr<pid_t> pid = supervisor.Launch(Shell("exit 0"), exits_.Callback());
  ASSERT_TRUE(pid.ok());
  ASSERT_TRUE(exits_.Wait(*pid).has_value());
  EXPECT_EQ(supervisor.Kill(*pid, absl::ZeroDuration()).code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace loom::agent
