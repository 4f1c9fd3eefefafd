#include "worker/agent/process_supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <grp.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"

extern char** environ;

namespace loom::agent {

struct ProcessSupervisor::Request {
  enum class Kind { kLaunch, kKill, kKillAll, kSignal };
  Kind kind = Kind::kLaunch;
  ProcessSpec spec;
  ExitCallback on_exit;
  pid_t pid = 0;
  absl::Duration grace;
  int sig = 0;  // kSignal
  absl::Notification done;
  absl::Status status;
};

namespace {

// Signals the child's whole group; falls back to the child alone when it has
// left its group (setsid), so a kill still reaches it.
void SignalGroup(pid_t pid, int sig) {
  if (kill(-pid, sig) != 0) kill(pid, sig);
}

// Only async-signal-safe calls may run between fork and exec, so messages are
// written with write(2) and errno is spelled without strerror.
void WriteAll(int fd, const char* text) {
  size_t left = strlen(text);
  while (left > 0) {
    ssize_t n = write(fd, text, left);
    if (n <= 0) return;
    text += n;
    left -= static_cast<size_t>(n);
  }
}

const char* ErrnoName(int error) {
  switch (error) {
    case ENOENT: return "no such file or directory";
    case EACCES: return "permission denied";
    case ENOEXEC: return "not an executable format";
    case ENOTDIR: return "not a directory";
    case ENOMEM: return "out of memory";
    case E2BIG: return "argument list too long";
    default: return "system error";
  }
}

[[noreturn]] void ChildFail(const char* what, const char* path, int error) {
  WriteAll(2, "loom-worker: ");
  WriteAll(2, what);
  WriteAll(2, " '");
  WriteAll(2, path);
  WriteAll(2, "': ");
  WriteAll(2, ErrnoName(error));
  WriteAll(2, "\n");
  _exit(127);
}

// Runs in the child between fork and exec.
[[noreturn]] void RunChild(pid_t parent, int log_fd, char* const* argv, char* const* envp,
                           const char* working_dir, uid_t uid, gid_t gid,
                           const std::vector<gid_t>& groups) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  // The parent may have died before prctl took effect; then nobody would
  // ever send the death signal.
  if (getppid() != parent) _exit(127);

  // Signal state is inherited: the agent blocks SIGTERM/SIGINT for its
  // signal thread and ignores SIGPIPE; a rank must start with defaults.
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  struct sigaction dfl;
  memset(&dfl, 0, sizeof(dfl));
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig != SIGKILL && sig != SIGSTOP) sigaction(sig, &dfl, nullptr);
  }

  int null_fd = open("/dev/null", O_RDONLY);
  if (null_fd >= 0) dup2(null_fd, 0);
  dup2(log_fd, 1);
  dup2(log_fd, 2);
  // Sockets and files of the agent (gRPC, other ranks' logs) stay behind.
  close_range(3, ~0U, 0);

  // Privileges go before anything of the job's is touched; a failure to drop
  // them is a failed launch, never a rank run as the agent's user.
  if (uid != static_cast<uid_t>(-1)) {
    // groups was built before fork: reading it allocates nothing.
    if (setgroups(groups.size(), groups.empty() ? nullptr : groups.data()) != 0 ||
        setgid(gid) != 0 || setuid(uid) != 0) {
      ChildFail("cannot switch to the rank user of", argv[0], errno);
    }
  }
  if (working_dir[0] != '\0' && chdir(working_dir) != 0) {
    ChildFail("cannot enter working directory", working_dir, errno);
  }
  execve(argv[0], argv, envp);
  ChildFail("cannot execute", argv[0], errno);
}

std::vector<std::string> ChildEnvironment(
    const std::vector<std::pair<std::string, std::string>>& overrides) {
  std::vector<std::string> env;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    std::string item(*entry);
    std::string name = item.substr(0, item.find('='));
    bool replaced = std::any_of(overrides.begin(), overrides.end(),
                                [&](const auto& kv) { return kv.first == name; });
    if (!replaced) env.push_back(std::move(item));
  }
  for (const auto& [name, value] : overrides) env.push_back(absl::StrCat(name, "=", value));
  return env;
}

std::vector<char*> CStrings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

}  // namespace

std::string DescribeExit(const ProcessExit& exit) {
  if (exit.signal == 0) return absl::StrCat("exit code ", exit.exit_code);
  const char* name = sigabbrev_np(exit.signal);
  return absl::StrCat("signal ", exit.signal, " (SIG", name != nullptr ? name : "?", ")");
}

ProcessSupervisor::ProcessSupervisor(absl::Duration shutdown_grace)
    : shutdown_grace_(shutdown_grace) {
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) {
    perror("loom-worker: eventfd");
    std::abort();
  }
  thread_ = std::thread([this] { Loop(); });
}

ProcessSupervisor::~ProcessSupervisor() {
  KillAll(shutdown_grace_);
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
  thread_.join();
  close(wake_fd_);
}

void ProcessSupervisor::Submit(std::shared_ptr<Request> request) {
  {
    absl::MutexLock lock(&mu_);
    requests_.push_back(request);
  }
  uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
  request->done.WaitForNotification();
}

absl::StatusOr<pid_t> ProcessSupervisor::Launch(ProcessSpec spec, ExitCallback on_exit) {
  auto request = std::make_shared<Request>();
  request->kind = Request::Kind::kLaunch;
  request->spec = std::move(spec);
  request->on_exit = std::move(on_exit);
  Submit(request);
  if (!request->status.ok()) return request->status;
  return request->pid;
}

absl::Status ProcessSupervisor::Kill(pid_t pid, absl::Duration grace) {
  auto request = std::make_shared<Request>();
  request->kind = Request::Kind::kKill;
  request->pid = pid;
  request->grace = grace;
  Submit(request);
  return request->status;
}

absl::Status ProcessSupervisor::Signal(pid_t pid, int sig) {
  if (sig != SIGSTOP && sig != SIGCONT) {
    return absl::InvalidArgumentError(
        absl::StrCat("signal ", sig, ": only SIGSTOP and SIGCONT go through Signal"));
  }
  auto request = std::make_shared<Request>();
  request->kind = Request::Kind::kSignal;
  request->pid = pid;
  request->sig = sig;
  Submit(request);
  return request->status;
}

void ProcessSupervisor::KillAll(absl::Duration grace) {
  auto request = std::make_shared<Request>();
  request->kind = Request::Kind::kKillAll;
  request->grace = grace;
  Submit(request);
}

std::vector<pid_t> ProcessSupervisor::Running() const {
  absl::MutexLock lock(&running_mu_);
  return running_;
}

void ProcessSupervisor::Loop() {
  while (true) {
    std::vector<pollfd> fds = {{wake_fd_, POLLIN, 0}};
    std::vector<pid_t> pids;
    int timeout_ms = -1;
    absl::Time now = absl::Now();
    for (const auto& [pid, child] : children_) {
      fds.push_back({child.pidfd, POLLIN, 0});
      pids.push_back(pid);
      if (child.kill_at.has_value()) {
        int64_t due = std::max<int64_t>(
            0, absl::ToInt64Milliseconds(absl::Ceil(*child.kill_at - now, absl::Milliseconds(1))));
        if (timeout_ms < 0 || due < timeout_ms) timeout_ms = static_cast<int>(due);
      }
    }
    int ready = poll(fds.data(), fds.size(), timeout_ms);
    if (ready < 0 && errno != EINTR) {
      perror("loom-worker: poll");
      std::abort();
    }
    if (fds[0].revents & POLLIN) {
      uint64_t count;
      (void)!read(wake_fd_, &count, sizeof(count));
    }

    std::deque<std::shared_ptr<Request>> batch;
    bool stopping;
    {
      absl::MutexLock lock(&mu_);
      batch.swap(requests_);
      stopping = stopping_;
    }
    for (auto& request : batch) Handle(request);
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents != 0) ReapIfExited(pids[i - 1]);
    }
    SendDueKills();

    if (children_.empty()) {
      for (auto& waiter : drain_waiters_) waiter->done.Notify();
      drain_waiters_.clear();
      if (stopping) return;
    }
  }
}

void ProcessSupervisor::Handle(std::shared_ptr<Request> shared) {
  Request& request = *shared;
  switch (request.kind) {
    case Request::Kind::kLaunch: {
      absl::StatusOr<pid_t> pid = Spawn(request.spec, std::move(request.on_exit));
      if (pid.ok()) {
        request.pid = *pid;
      } else {
        request.status = pid.status();
      }
      request.done.Notify();
      return;
    }
    case Request::Kind::kKill: {
      auto it = children_.find(request.pid);
      if (it == children_.end()) {
        request.status = absl::NotFoundError(
            absl::StrCat("pid ", request.pid, " is not a running child of this agent"));
      } else {
        Terminate(it->first, it->second, request.grace);
      }
      request.done.Notify();
      return;
    }
    case Request::Kind::kSignal: {
      // On this thread, so the pid cannot have been reaped (and reused) in
      // between: an unreaped child keeps its pid.
      auto it = children_.find(request.pid);
      if (it == children_.end()) {
        request.status = absl::NotFoundError(
            absl::StrCat("pid ", request.pid, " is not a running child of this agent"));
      } else {
        SignalGroup(it->first, request.sig);
        it->second.stopped = request.sig == SIGSTOP;
        if (it->second.stopped && it->second.kill_at.has_value()) {
          // A kill already under way: a stopped child cannot handle its
          // SIGTERM, so it ends now.
          SignalGroup(it->first, SIGKILL);
          it->second.kill_at.reset();
        }
      }
      request.done.Notify();
      return;
    }
    case Request::Kind::kKillAll: {
      for (auto& [pid, child] : children_) Terminate(pid, child, request.grace);
      // Answered by Loop once no child is left.
      drain_waiters_.push_back(std::move(shared));
      return;
    }
  }
}

absl::StatusOr<pid_t> ProcessSupervisor::Spawn(const ProcessSpec& spec, ExitCallback on_exit) {
  if (spec.argv.empty() || spec.argv[0].empty()) {
    return absl::InvalidArgumentError("process argv is empty: nothing to execute");
  }
  if (access(spec.argv[0].c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot execute '", spec.argv[0], "': ", strerror(errno)));
  }
  const std::string log_path = spec.log_path.empty() ? "/dev/null" : spec.log_path;
  int log_fd = spec.log_path.empty()
                   ? open(log_path.c_str(), O_WRONLY | O_CLOEXEC)
                   : open(log_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                          0600);
  if (log_fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open log file '", log_path, "': ", strerror(errno)));
  }
  // Everything the child needs is built before fork: after it, only
  // async-signal-safe calls are allowed in a multithreaded process.
  std::vector<std::string> argv_strings = spec.argv;
  std::vector<char*> argv = CStrings(argv_strings);
  std::vector<std::string> env_strings = ChildEnvironment(spec.env);
  std::vector<char*> envp = CStrings(env_strings);
  const pid_t parent = getpid();

  pid_t pid = fork();
  if (pid < 0) {
    int error = errno;
    close(log_fd);
    return absl::ResourceExhaustedError(absl::StrCat("fork failed: ", strerror(error)));
  }
  if (pid == 0) {
    RunChild(parent, log_fd, argv.data(), envp.data(), spec.working_dir.c_str(), spec.uid,
             spec.gid, spec.groups);
  }

  close(log_fd);
  // Also set here so that a kill sent right after Launch returns reaches the
  // group even if the child has not run yet.
  setpgid(pid, pid);
  // Through syscall(2): glibc 2.36's <sys/pidfd.h> lacks C linkage for C++.
  int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) {
    int error = errno;
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    return absl::InternalError(absl::StrCat("pidfd_open failed: ", strerror(error)));
  }
  Child& child = children_[pid];
  child.pidfd = pidfd;
  child.on_exit = std::move(on_exit);
  absl::MutexLock lock(&running_mu_);
  running_.push_back(pid);
  return pid;
}

void ProcessSupervisor::Terminate(pid_t pid, Child& child, absl::Duration grace) {
  if (grace <= absl::ZeroDuration() || child.stopped) {
    SignalGroup(pid, SIGKILL);
    child.kill_at.reset();
    return;
  }
  SignalGroup(pid, SIGTERM);
  absl::Time due = absl::Now() + grace;
  if (!child.kill_at.has_value() || due < *child.kill_at) child.kill_at = due;
}

void ProcessSupervisor::SendDueKills() {
  absl::Time now = absl::Now();
  for (auto& [pid, child] : children_) {
    if (child.kill_at.has_value() && *child.kill_at <= now) {
      SignalGroup(pid, SIGKILL);
      child.kill_at.reset();
    }
  }
}

void ProcessSupervisor::ReapIfExited(pid_t pid) {
  siginfo_t info;
  memset(&info, 0, sizeof(info));
  if (waitid(P_PID, pid, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid != pid) return;
  // The leader is a zombie, so its group id cannot be reused yet: whatever is
  // left in the group (helpers the rank forked) goes with it.
  kill(-pid, SIGKILL);
  memset(&info, 0, sizeof(info));
  if (waitid(P_PID, pid, &info, WEXITED) != 0) return;

  ProcessExit exit;
  exit.pid = pid;
  if (info.si_code == CLD_EXITED) {
    exit.exit_code = info.si_status;
  } else {
    exit.signal = info.si_status;
  }
  auto it = children_.find(pid);
  close(it->second.pidfd);
  ExitCallback on_exit = std::move(it->second.on_exit);
  children_.erase(it);
  {
    absl::MutexLock lock(&running_mu_);
    running_.erase(std::remove(running_.begin(), running_.end(), pid), running_.end());
  }
  if (on_exit) on_exit(exit);
}

}  // namespace loom::agent
