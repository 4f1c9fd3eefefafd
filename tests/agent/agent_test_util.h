// Helpers shared by the agent tests: temporary directories, waiting for a log
// line, collecting exits, and checking (and reaping) processes by pid.
#pragma once

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "tests/common/scratch_dir.h"
#include "absl/time/time.h"
#include "worker/agent/process_supervisor.h"

namespace loom::agent::testing {

// A fresh directory, removed by the destructor.
class TempDir : public loom::testing::ScratchDir {
 public:
  TempDir() : loom::testing::ScratchDir("loom_agent_test") {}
};

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Polls the file until it contains `needle`; bounded so that a broken build
// fails instead of hanging.
inline bool WaitForFileContains(const std::string& path, const std::string& needle,
                                absl::Duration timeout = absl::Seconds(20)) {
  absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (ReadFile(path).find(needle) != std::string::npos) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return false;
}

// The first whole number that follows `prefix` in the file, once it is there.
inline pid_t WaitForPid(const std::string& path, const std::string& prefix) {
  absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (absl::Now() < deadline) {
    std::string text = ReadFile(path);
    size_t at = text.find(prefix);
    if (at != std::string::npos) {
      size_t end = text.find('\n', at);
      if (end != std::string::npos) return static_cast<pid_t>(atoi(text.c_str() + at + prefix.size()));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return -1;
}

// The process state letter from /proc/<pid>/stat, or 0 when there is none.
inline char ProcState(pid_t pid) {
  std::string stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  size_t paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 2 >= stat.size()) return 0;
  return stat[paren + 2];
}

// Polls until the process is stopped (state T) or, with stopped == false,
// running again (any other state of a live process); false after the timeout.
inline bool WaitStopped(pid_t pid, bool stopped, absl::Duration timeout = absl::Seconds(20)) {
  absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    const char state = ProcState(pid);
    if (state != 0 && (state == 'T') == stopped) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return false;
}

struct GoneResult {
  bool gone = false;
  std::optional<int> reaped_status;  // set when this process reaped it
};

// Waits until `pid` no longer runs. A process orphaned onto this process
// (see MakeSubreaper) is reaped here, so the test leaves no zombie.
inline GoneResult WaitGone(pid_t pid, absl::Duration timeout = absl::Seconds(20)) {
  absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    int status = 0;
    pid_t reaped = waitpid(pid, &status, WNOHANG);
    if (reaped == pid) return {true, status};
    if (kill(pid, 0) != 0 && errno == ESRCH) return {true, std::nullopt};
    char state = ProcState(pid);
    // A zombie that is not ours (reparented to init) is dead all the same.
    if (reaped < 0 && (state == 'Z' || state == 'X' || state == 0)) return {true, std::nullopt};
    absl::SleepFor(absl::Milliseconds(10));
  }
  return {false, std::nullopt};
}

// Orphans of this test's descendants come to this process instead of init,
// so they can be found and reaped by pid.
inline void MakeSubreaper() { prctl(PR_SET_CHILD_SUBREAPER, 1); }

// Kills a process left over by a failed test, by pid.
inline void KillAndReap(pid_t pid) {
  if (pid <= 0) return;
  kill(pid, SIGKILL);
  WaitGone(pid, absl::Seconds(5));
}

// Collects the exits a supervisor reports.
class ExitCollector {
 public:
  ProcessSupervisor::ExitCallback Callback() {
    return [this](const ProcessExit& exit) {
      absl::MutexLock lock(&mu_);
      exits_[exit.pid] = exit;
    };
  }
  std::optional<ProcessExit> Wait(pid_t pid, absl::Duration timeout = absl::Seconds(30)) {
    absl::MutexLock lock(&mu_);
    auto has = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return exits_.count(pid) != 0; };
    mu_.AwaitWithTimeout(absl::Condition(&has), timeout);
    if (!has()) return std::nullopt;
    return exits_[pid];
  }
  size_t size() {
    absl::MutexLock lock(&mu_);
    return exits_.size();
  }

 private:
  absl::Mutex mu_;
  std::map<pid_t, ProcessExit> exits_ ABSL_GUARDED_BY(mu_);
};

}  // namespace loom::agent::testing
