// Process supervision for the node agent: starts child processes, kills them
// (SIGTERM, then SIGKILL after a grace period), reaps them by pid and reports
// how each one ended. Knows nothing of ranks or gRPC, so it is tested with
// /bin/sh children.
//
// Guarantees:
// - Every child runs in its own process group (pgid == pid); kills and the
//   clean-up after a child's exit address the whole group.
// - Every child has PR_SET_PDEATHSIG=SIGKILL, set by the one long-lived thread
//   that forks them all, so children die with the supervisor's process even
//   when that process is SIGKILLed.
// - Children are reaped by pid only (pidfds), never with waitpid(-1), so other
//   children of the process are left alone.
// - The destructor kills what is still running and waits for it.
// - A child stopped through Signal(SIGSTOP) is killed with SIGKILL at once:
//   it could not handle SIGTERM (which stays pending while it is stopped),
//   and continuing it to do so would let it run again.
#pragma once

#include <sys/types.h>

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace loom::agent {

struct ProcessSpec {
  // argv[0] is the executable's path; there is no PATH search.
  std::vector<std::string> argv;
  // Set (or replaced) in the child's copy of this process's environment.
  std::vector<std::pair<std::string, std::string>> env;
  // stdout and stderr go here: a new file (O_CREAT | O_EXCL | O_NOFOLLOW,
  // mode 0600), so an existing file or a planted symlink is refused rather
  // than truncated or followed; empty: /dev/null.
  std::string log_path;
  // The child's working directory; empty keeps this process's.
  std::string working_dir;
  // Run the child as this user and group (setgroups, setgid, setuid before
  // exec); -1: as this process.
  uid_t uid = static_cast<uid_t>(-1);
  gid_t gid = static_cast<gid_t>(-1);
  // With uid set: its only supplementary groups (none when empty).
  std::vector<gid_t> groups;
};

struct ProcessExit {
  pid_t pid = 0;
  int exit_code = 0;  // valid when signal == 0
  int signal = 0;     // the signal that ended the process, 0 if it exited
};

// "exit code 3" or "signal 9 (SIGKILL)", for logs and failure reasons.
std::string DescribeExit(const ProcessExit& exit);

class ProcessSupervisor {
 public:
  // Runs on the supervision thread; it must not call back into the supervisor.
  using ExitCallback = std::function<void(const ProcessExit&)>;

  // shutdown_grace: how long the destructor waits after SIGTERM before SIGKILL.
  explicit ProcessSupervisor(absl::Duration shutdown_grace = absl::Seconds(2));
  ~ProcessSupervisor();
  ProcessSupervisor(const ProcessSupervisor&) = delete;
  ProcessSupervisor& operator=(const ProcessSupervisor&) = delete;

  // Starts a child; on_exit is called once when it has been reaped. Fails
  // (and starts nothing) when argv[0] is not executable or the log cannot be
  // opened.
  absl::StatusOr<pid_t> Launch(ProcessSpec spec, ExitCallback on_exit);

  // SIGTERM to the child's process group now, SIGKILL after grace (at once
  // when grace <= 0). NotFound when pid is not a running child of ours.
  absl::Status Kill(pid_t pid, absl::Duration grace);

  // Sends SIGSTOP or SIGCONT to the child's process group (pausing and
  // continuing it; nothing else is accepted: kills go through Kill).
  // NotFound when pid is not a running child of ours.
  absl::Status Signal(pid_t pid, int sig);

  // Kills every running child like Kill and returns once all are reaped
  // (their on_exit callbacks have run).
  void KillAll(absl::Duration grace);

  // Pids of the children not reaped yet.
  std::vector<pid_t> Running() const;

 private:
  struct Child {
    int pidfd = -1;
    ExitCallback on_exit;
    std::optional<absl::Time> kill_at;  // when SIGKILL is due
    bool stopped = false;               // SIGSTOPped by Signal, not continued since
  };
  struct Request;

  void Submit(std::shared_ptr<Request> request);
  void Loop();
  void Handle(std::shared_ptr<Request> request);
  absl::StatusOr<pid_t> Spawn(const ProcessSpec& spec, ExitCallback on_exit);
  void Terminate(pid_t pid, Child& child, absl::Duration grace);
  void ReapIfExited(pid_t pid);
  void SendDueKills();

  const absl::Duration shutdown_grace_;
  int wake_fd_ = -1;  // eventfd: requests are waiting

  absl::Mutex mu_;
  std::deque<std::shared_ptr<Request>> requests_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  mutable absl::Mutex running_mu_;
  std::vector<pid_t> running_ ABSL_GUARDED_BY(running_mu_);

  // Owned by the supervision thread.
  std::map<pid_t, Child> children_;
  std::vector<std::shared_ptr<Request>> drain_waiters_;

  std::thread thread_;  // last: started after everything above exists
};

}  // namespace loom::agent
