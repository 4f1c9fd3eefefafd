#include "worker/agent/rank_manager.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/confine/path_resolve.h"
#include "common/confine/path_rules.h"
#include "common/exit_codes.h"
#include "worker/agent/log_read_queue.h"
#include "worker/agent/log_tail.h"

namespace loom::agent {

namespace fs = std::filesystem;

namespace {

// Writes a new file (never through a symlink, never over an existing one)
// owned by the user the rank runs as.
absl::Status WriteRankFile(const std::string& path, const std::string& bytes,
                           const confine::FileOwner& owner) {
  absl::StatusOr<int> fd = confine::CreateNewFile(path, 0600);
  if (!fd.ok()) return fd.status();
  bool written = write(*fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size());
  if (owner.uid != static_cast<uid_t>(-1)) {
    written = written && fchown(*fd, owner.uid, owner.gid) == 0;
  }
  close(*fd);
  if (!written) return absl::InternalError(absl::StrCat("cannot write '", path, "'"));
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateJobId(const std::string& job_id) {
  if (confine::IsSafeName(job_id)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "assignment.job_id='", confine::Printable(job_id),
      "' must be 1-200 letters, digits, '.', '_' or '-' (it names a directory)"));
}

RankManager::RankManager(RankManagerOptions options, ExitSink sink)
    : options_(std::move(options)), sink_(std::move(sink)), supervisor_(options_.default_grace) {}

RankManager::~RankManager() { Shutdown(options_.default_grace); }

std::string RankManager::RankDir(const std::string& job_id, int attempt, int rank) const {
  return absl::StrCat(options_.work_dir, "/jobs/", job_id, "/attempt_", attempt, "/rank_", rank);
}

std::string RankLogRelative(const std::string& job_id, int attempt, int rank) {
  return absl::StrCat("jobs/", job_id, "/attempt_", attempt, "/rank_", rank, "/log.txt");
}

loom::v1::RankLogChunk RankManager::ReadLog(const loom::v1::ReadRankLog& request) const {
  loom::v1::RankLogChunk chunk;
  auto fail = [&chunk](const absl::Status& status) {
    chunk.set_error_code(static_cast<int>(status.code()));
    chunk.set_error(std::string(status.message()));
    return chunk;
  };
  if (absl::Status valid = ValidateJobId(request.job_id()); !valid.ok()) return fail(valid);
  if (request.attempt() < 1 || request.rank() < 0) {
    return fail(absl::InvalidArgumentError("attempt must be at least 1 and rank not negative"));
  }
  const size_t max_bytes = static_cast<size_t>(
      std::clamp<int64_t>(request.max_bytes(), 1, kMaxLogChunkBytes));
  // Where the process of that rank and attempt was launched: its own
  // attempt, or, for a survivor, an earlier one (RankDir's layout).
  std::string relative;
  {
    absl::MutexLock lock(&mu_);
    auto it = ranks_.find(Key{request.job_id(), request.attempt(), request.rank()});
    if (it != ranks_.end()) {
      chunk.set_running(true);
      relative = it->second.log_path.substr(options_.work_dir.size() + 1);
    }
  }
  if (relative.empty()) {
    // Ended: the newest launch directory of that rank at or before the
    // attempt (a bounded look back; survivors rarely span more).
    for (int attempt = request.attempt(); attempt >= 1 && attempt > request.attempt() - 64;
         --attempt) {
      std::string candidate = RankLogRelative(request.job_id(), attempt, request.rank());
      struct stat info = {};
      if (fstatat(AT_FDCWD, (options_.work_dir + "/" + candidate).c_str(), &info,
                  AT_SYMLINK_NOFOLLOW) == 0) {
        relative = candidate;
        break;
      }
    }
  }
  if (relative.empty()) {
    return fail(absl::NotFoundError(absl::StrCat("no log of rank ", request.rank(), " of job ",
                                                 request.job_id(), " attempt ", request.attempt(),
                                                 " on this node")));
  }
  absl::StatusOr<LogRead> read =
      ReadLogBeneath(options_.work_dir, relative, request.offset(), max_bytes);
  if (!read.ok()) return fail(read.status());
  chunk.set_data(std::move(read->data));
  chunk.set_offset(read->offset);
  chunk.set_file_size(read->file_size);
  return chunk;
}

void RankManager::ReportLaunchFailure(const loom::v1::RankAssignment& assignment,
                                      const std::string& log_path, const std::string& reason,
                                      int exit_code) {
  std::string line = absl::StrCat("loom-worker: cannot start rank ", assignment.rank(), " of job ",
                                  assignment.job_id(), " attempt ", assignment.attempt(), ": ",
                                  reason);
  fprintf(stderr, "%s\n", line.c_str());
  if (!log_path.empty()) {
    // Never through a symlink: the log lives in the rank's fresh directory.
    int fd = open(log_path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0) {
      const std::string text = line + "\n";
      (void)!write(fd, text.data(), text.size());
      close(fd);
    }
  }
  loom::v1::RankExited exited;
  exited.set_job_id(assignment.job_id());
  exited.set_attempt(assignment.attempt());
  exited.set_rank(assignment.rank());
  exited.set_exit_code(exit_code);
  exited.set_log_path(log_path);
  exited.set_log_tail(line);
  sink_(std::move(exited));
}

absl::Status RankManager::Launch(const loom::v1::RankAssignment& assignment) {
  if (absl::Status valid = ValidateJobId(assignment.job_id()); !valid.ok()) {
    ReportLaunchFailure(assignment, "", std::string(valid.message()));
    return valid;
  }
  if (assignment.attempt() < 0 || assignment.rank() < 0) {
    absl::Status bad = absl::InvalidArgumentError(
        absl::StrCat("assignment.attempt=", assignment.attempt(), " and assignment.rank=",
                     assignment.rank(), " must not be negative"));
    ReportLaunchFailure(assignment, "", std::string(bad.message()));
    return bad;
  }
  const Key key{assignment.job_id(), assignment.attempt(), assignment.rank()};
  const std::string dir = RankDir(assignment.job_id(), assignment.attempt(), assignment.rank());
  const std::string log_path = dir + "/log.txt";
  const std::string log_relative =
      RankLogRelative(assignment.job_id(), assignment.attempt(), assignment.rank());
  uint64_t id = 0;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) {
      return absl::FailedPreconditionError("the agent is shutting down; launch refused");
    }
    if (ranks_.count(key) != 0) {
      return absl::AlreadyExistsError(absl::StrCat("rank ", assignment.rank(), " of job ",
                                                   assignment.job_id(), " attempt ",
                                                   assignment.attempt(), " is already running"));
    }
    id = next_id_++;
    Rank& rank = ranks_[key];
    rank.id = id;
    rank.log_path = log_path;
    rank.token = assignment.rank_token();
    rank.store_namespace = assignment.store_namespace();
    rank.lease_generation = LeaseState().generation;
    keys_[id] = key;
  }
  // Before the process exists: what the rank is told from now on waits for
  // its stream.
  if (options_.control != nullptr) options_.control->Open(id);
  bool dir_made = false;
  auto fail = [&](const std::string& reason, int exit_code = kLaunchFailedExitCode) {
    {
      absl::MutexLock lock(&mu_);
      auto it = keys_.find(id);
      if (it != keys_.end()) {
        ranks_.erase(it->second);
        keys_.erase(it);
      }
    }
    if (options_.control != nullptr) options_.control->Close(id);
    ReportLaunchFailure(assignment, dir_made ? log_path : "", reason, exit_code);
    return absl::FailedPreconditionError(reason);
  };

  // Who it runs as: a job whose uid this node may not use cannot run here.
  absl::StatusOr<RankUser> user = RankUserFor(assignment, options_.job_uids, options_.run_as);
  if (!user.ok()) return fail(std::string(user.status().message()), kExitJobBroken);
  LaunchRoots roots = options_.roots;
  roots.rank_owner = user->owner;
  roots.checkpoint_mode = user->checkpoint_mode;
  // This node's own confinement: a job that names files outside its roots
  // cannot run anywhere here, so it is not worth a restart.
  loom::v1::RankAssignment confined = assignment;
  if (absl::Status s = ConfineAssignment(confined, roots); !s.ok()) {
    return fail(std::string(s.message()), kExitJobBroken);
  }

  std::error_code error;
  fs::create_directories(options_.work_dir, error);
  absl::StatusOr<std::string> made = confine::MakeDirsBeneath(
      options_.work_dir,
      {"jobs", assignment.job_id(), absl::StrCat("attempt_", assignment.attempt()),
       absl::StrCat("rank_", assignment.rank())},
      /*fresh_last=*/true, user->owner);
  if (!made.ok()) return fail(std::string(made.status().message()));
  dir_made = true;
  const std::string assignment_path = dir + "/assignment.pb";
  {
    // Written whole, then renamed, so a trainer never reads half a file.
    const std::string temp_path = assignment_path + ".tmp";
    if (absl::Status s = WriteRankFile(temp_path, confined.SerializeAsString(), user->owner);
        !s.ok()) {
      return fail(std::string(s.message()));
    }
    fs::rename(temp_path, assignment_path, error);
    if (error) return fail(absl::StrCat("cannot write '", assignment_path, "': ", error.message()));
  }

  ProcessSpec spec;
  // The trainer gets no coordinator address and no certificate: it talks only
  // to this agent, whose socket its rank token opens.
  spec.argv = {options_.trainer_path, absl::StrCat("--assignment=", assignment_path),
               absl::StrCat("--work_dir=", dir)};
  if (!options_.agent_socket.empty()) {
    spec.argv.push_back(absl::StrCat("--agent_socket=", options_.agent_socket));
  }
  const std::string threads = absl::StrCat(std::max(1, options_.threads_per_rank));
  // Passive OpenMP waiting: ranks share cores with each other and the agent,
  // and spinning workers would steal them (libgomp reads this at load time).
  spec.env = {{"OMP_NUM_THREADS", threads},
              {"OPENBLAS_NUM_THREADS", threads},
              {"OMP_WAIT_POLICY", "PASSIVE"}};
  if (options_.gpu_devices) {
    spec.env.push_back({"CUDA_VISIBLE_DEVICES", absl::StrCat(assignment.local_device())});
  }
  spec.log_path = log_path;
  spec.working_dir = dir;
  spec.uid = user->owner.uid;
  spec.gid = user->owner.gid;
  spec.groups = user->groups;

  auto on_exit = [this, id, log_path, log_relative](const ProcessExit& exit) {
    loom::v1::RankExited exited;
    {
      // The rank's attempt as it is now: an EnterEpoch may have moved it.
      absl::MutexLock lock(&mu_);
      auto it = keys_.find(id);
      if (it == keys_.end()) return;  // cannot happen: only the exit erases a launched rank
      const auto& [job_id, attempt, number] = it->second;
      exited.set_job_id(job_id);
      exited.set_attempt(attempt);
      exited.set_rank(number);
      ranks_.erase(it->second);
      keys_.erase(it);
    }
    if (options_.control != nullptr) options_.control->Close(id);
    exited.set_log_path(log_path);
    exited.set_exit_code(exit.exit_code);
    exited.set_signal(exit.signal);
    // When the exit was seen: where the coordinator's incident begins.
    exited.set_exited_unix_us(absl::ToUnixMicros(absl::Now()));
    // Read beneath the work dir without following what the rank may have planted.
    exited.set_log_tail(ReadLogTail(options_.work_dir, log_relative, 20));
    fprintf(stderr, "loom-worker: rank %d of job %s attempt %d (pid %d) ended: %s\n",
            exited.rank(), exited.job_id().c_str(), exited.attempt(), exit.pid,
            DescribeExit(exit).c_str());
    sink_(std::move(exited));
  };

  absl::StatusOr<pid_t> pid = supervisor_.Launch(std::move(spec), std::move(on_exit));
  if (!pid.ok()) return fail(std::string(pid.status().message()));
  {
    absl::MutexLock signals(&signal_mu_);
    bool stop = false;
    {
      absl::MutexLock lock(&mu_);
      // The rank may already have exited and been erased by on_exit.
      auto it = keys_.find(id);
      if (it != keys_.end()) {
        Rank& rank = ranks_[it->second];
        rank.pid = *pid;
        // The lease ran out while it was being started: PauseAll could not
        // stop it yet.
        stop = rank.lease_generation != LeaseState().generation && !rank.stopped;
        rank.stopped = rank.stopped || stop;
      }
    }
    if (stop) (void)supervisor_.Signal(*pid, SIGSTOP);
  }
  fprintf(stderr, "loom-worker: started rank %d of job %s attempt %d (pid %d), log %s\n",
          assignment.rank(), assignment.job_id().c_str(), assignment.attempt(), *pid,
          log_path.c_str());
  return absl::OkStatus();
}

int RankManager::Kill(const loom::v1::KillRanks& kill) {
  const absl::Duration grace = kill.grace_seconds() > 0 ? absl::Seconds(kill.grace_seconds())
                                                        : options_.default_grace;
  const std::set<int32_t> only(kill.ranks().begin(), kill.ranks().end());
  std::vector<pid_t> pids;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, rank] : ranks_) {
      const auto& [job_id, attempt, number] = key;
      if (job_id == kill.job_id() && (kill.attempt() == 0 || attempt == kill.attempt()) &&
          (only.empty() || only.count(number) != 0) && rank.pid != 0) {
        pids.push_back(rank.pid);
      }
    }
  }
  int signalled = 0;
  // A rank that ended meanwhile is simply not found: its exit is reported
  // anyway. A paused rank is SIGKILLed at once (process_supervisor.h).
  for (pid_t pid : pids) signalled += supervisor_.Kill(pid, grace).ok() ? 1 : 0;
  return signalled;
}

int RankManager::Abort(const loom::v1::AbortRanks& abort) {
  std::vector<uint64_t> ids;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, rank] : ranks_) {
      if (std::get<0>(key) == abort.job_id() && std::get<1>(key) == abort.attempt()) {
        ids.push_back(rank.id);
      }
    }
  }
  fprintf(stderr, "loom-worker: abort for job %s attempt %d (%s): telling %zu ranks\n",
          abort.job_id().c_str(), abort.attempt(), abort.reason().c_str(), ids.size());
  if (options_.control != nullptr) {
    loom::v1::RankControl message;
    *message.mutable_abort() = abort;
    for (uint64_t id : ids) options_.control->Push(id, message);
  }
  return static_cast<int>(ids.size());
}

int RankManager::Stop(const loom::v1::StopRanks& stop) {
  std::vector<uint64_t> ids;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, rank] : ranks_) {
      if (std::get<0>(key) == stop.job_id() &&
          (stop.attempt() == 0 || std::get<1>(key) == stop.attempt())) {
        ids.push_back(rank.id);
      }
    }
  }
  if (stop.spill_step() > 0) {
    fprintf(stderr,
            "loom-worker: job %s attempt %d ends (%s): telling %zu ranks to write their "
            "snapshots of step %lld as a checkpoint\n",
            stop.job_id().c_str(), stop.attempt(), stop.reason().c_str(), ids.size(),
            static_cast<long long>(stop.spill_step()));
  } else {
    fprintf(stderr, "loom-worker: graceful stop of job %s attempt %d (%s): telling %zu ranks\n",
            stop.job_id().c_str(), stop.attempt(), stop.reason().c_str(), ids.size());
  }
  if (options_.control != nullptr) {
    loom::v1::RankControl message;
    *message.mutable_stop() = stop;
    for (uint64_t id : ids) options_.control->Push(id, message);
  }
  return static_cast<int>(ids.size());
}

int RankManager::StopAll(const std::string& reason) {
  std::vector<std::pair<uint64_t, loom::v1::RankControl>> pushes;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, rank] : ranks_) {
      loom::v1::RankControl message;
      message.mutable_stop()->set_job_id(std::get<0>(key));
      message.mutable_stop()->set_attempt(std::get<1>(key));
      message.mutable_stop()->set_reason(reason);
      pushes.emplace_back(rank.id, std::move(message));
    }
  }
  if (options_.control != nullptr) {
    for (auto& [id, message] : pushes) options_.control->Push(id, std::move(message));
  }
  return static_cast<int>(pushes.size());
}

int RankManager::Trace(const loom::v1::TraceStep& trace) {
  const std::set<int> listed(trace.ranks().begin(), trace.ranks().end());
  std::vector<uint64_t> ids;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, rank] : ranks_) {
      if (std::get<0>(key) == trace.job_id() && std::get<1>(key) == trace.attempt() &&
          (listed.empty() || listed.contains(std::get<2>(key)))) {
        ids.push_back(rank.id);
      }
    }
  }
  if (options_.control != nullptr) {
    loom::v1::RankControl message;
    *message.mutable_trace() = trace;
    for (uint64_t id : ids) options_.control->Push(id, message);
  }
  return static_cast<int>(ids.size());
}

int RankManager::EnterEpoch(const loom::v1::EnterEpoch& epoch) {
  if (epoch.attempt() <= epoch.from_attempt()) {
    fprintf(stderr,
            "loom-worker: EnterEpoch for job %s ignored: attempt %d must come after "
            "from_attempt %d\n",
            epoch.job_id().c_str(), epoch.attempt(), epoch.from_attempt());
    return 0;
  }
  std::vector<std::pair<uint64_t, loom::v1::RankControl>> pushes;
  std::vector<std::string> notes;
  {
    absl::MutexLock lock(&mu_);
    for (const loom::v1::RankEpoch& entry : epoch.ranks()) {
      const Key from{epoch.job_id(), epoch.from_attempt(), entry.rank()};
      const Key to{epoch.job_id(), epoch.attempt(), entry.rank()};
      auto it = ranks_.find(from);
      if (it == ranks_.end()) {
        auto there = ranks_.find(to);
        if (there != ranks_.end() && ConstantTimeEquals(there->second.token, entry.rank_token())) {
          continue;  // moved by an earlier copy of this message
        }
        notes.push_back(absl::StrCat("rank ", entry.rank(), " is not running here in attempt ",
                                     epoch.from_attempt()));
        continue;
      }
      if (entry.rank_token().empty() || ranks_.count(to) != 0) {
        notes.push_back(absl::StrCat("rank ", entry.rank(),
                                     entry.rank_token().empty()
                                         ? " has no token for the new attempt"
                                         : " already runs here in the new attempt"));
        continue;
      }
      Rank moved = std::move(it->second);
      ranks_.erase(it);
      // From here on the old token opens nothing: every check looks the
      // token up in this table.
      moved.token = entry.rank_token();
      moved.store_namespace = epoch.store_namespace();
      keys_[moved.id] = to;
      loom::v1::RankControl message;
      loom::v1::EnterEpoch* own = message.mutable_enter_epoch();
      own->set_job_id(epoch.job_id());
      own->set_from_attempt(epoch.from_attempt());
      own->set_attempt(epoch.attempt());
      own->set_store_namespace(epoch.store_namespace());
      own->set_restore_step(epoch.restore_step());
      *own->add_ranks() = entry;  // its own entry only: no other rank's token
      pushes.emplace_back(moved.id, std::move(message));
      notes.push_back(absl::StrCat("rank ", entry.rank(), " (pid ", moved.pid, ") moved on"));
      ranks_.emplace(to, std::move(moved));
    }
  }
  for (const std::string& note : notes) {
    fprintf(stderr, "loom-worker: EnterEpoch job %s attempt %d -> %d: %s\n",
            epoch.job_id().c_str(), epoch.from_attempt(), epoch.attempt(), note.c_str());
  }
  if (options_.control != nullptr) {
    for (auto& [id, message] : pushes) options_.control->Push(id, std::move(message));
  }
  return static_cast<int>(pushes.size());
}

int RankManager::Resume(const loom::v1::ResumeRanks& resume) {
  absl::MutexLock signals(&signal_mu_);
  std::vector<pid_t> continued;
  int resumed = 0;
  {
    absl::MutexLock lock(&mu_);
    const Lease::State lease = LeaseState();
    for (const loom::v1::RunningRank& named : resume.ranks()) {
      auto it = ranks_.find(Key{named.job_id(), named.attempt(), named.rank()});
      if (it == ranks_.end()) continue;
      Rank& rank = it->second;
      if (named.pid() != 0 && named.pid() != rank.pid) continue;  // another process of that rank
      if (!rank.stopped && rank.lease_generation == lease.generation) continue;  // not paused
      rank.lease_generation = lease.generation;
      if (rank.stopped && rank.pid != 0) continued.push_back(rank.pid);
      rank.stopped = false;
      ++resumed;
    }
  }
  for (pid_t pid : continued) (void)supervisor_.Signal(pid, SIGCONT);
  if (resumed > 0) fprintf(stderr, "loom-worker: resumed %d paused ranks\n", resumed);
  return resumed;
}

int RankManager::PauseAll() {
  absl::MutexLock signals(&signal_mu_);
  std::vector<pid_t> stop;
  {
    absl::MutexLock lock(&mu_);
    const Lease::State lease = LeaseState();
    for (auto& [key, rank] : ranks_) {
      if (rank.stopped || rank.pid == 0 || rank.lease_generation == lease.generation) continue;
      rank.stopped = true;
      stop.push_back(rank.pid);
    }
  }
  int stopped = 0;
  for (pid_t pid : stop) stopped += supervisor_.Signal(pid, SIGSTOP).ok() ? 1 : 0;
  return stopped;
}

Lease::State RankManager::LeaseState() const {
  return options_.lease != nullptr ? options_.lease->Observe() : Lease::State{};
}

RankIdentity RankManager::Identity(const Key& key, const Rank& rank, const Lease::State& lease) {
  RankIdentity identity;
  identity.job_id = std::get<0>(key);
  identity.attempt = std::get<1>(key);
  identity.rank = std::get<2>(key);
  identity.store_namespace = rank.store_namespace;
  identity.launch_id = rank.id;
  identity.paused = Paused(rank, lease);
  identity.lease_generation = rank.lease_generation;
  return identity;
}

std::vector<loom::v1::RunningRank> RankManager::Running() const {
  std::vector<loom::v1::RunningRank> running;
  absl::MutexLock lock(&mu_);
  const Lease::State lease = LeaseState();
  for (const auto& [key, rank] : ranks_) {
    if (rank.pid == 0) continue;
    loom::v1::RunningRank entry;
    entry.set_job_id(std::get<0>(key));
    entry.set_attempt(std::get<1>(key));
    entry.set_rank(std::get<2>(key));
    entry.set_pid(rank.pid);
    // Needs a ResumeRanks: stopped, or fenced by a run-out since its launch
    // or resume.
    entry.set_paused(rank.stopped || rank.lease_generation != lease.generation);
    running.push_back(std::move(entry));
  }
  return running;
}

std::optional<RankIdentity> RankManager::RankForToken(std::string_view token) const {
  std::optional<RankIdentity> found;
  if (token.empty()) return found;
  absl::MutexLock lock(&mu_);
  const Lease::State lease = LeaseState();
  // Every rank is compared: the time does not say which one matched. A rank
  // counts from its launch (before its pid is recorded: a trainer that starts
  // quickly may call before the launching thread has noted it) until its exit
  // erases it.
  for (const auto& [key, rank] : ranks_) {
    if (ConstantTimeEquals(rank.token, token)) found = Identity(key, rank, lease);
  }
  return found;
}

std::optional<RankIdentity> RankManager::RankForLaunch(uint64_t launch_id) const {
  absl::MutexLock lock(&mu_);
  auto it = keys_.find(launch_id);
  if (it == keys_.end()) return std::nullopt;
  return Identity(it->second, ranks_.at(it->second), LeaseState());
}

void RankManager::Shutdown(absl::Duration grace) {
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }
  supervisor_.KillAll(grace);
}

}  // namespace loom::agent
