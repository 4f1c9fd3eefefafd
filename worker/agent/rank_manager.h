// The agent's ranks: turns LaunchRank and KillRanks commands into trainer
// processes (through ProcessSupervisor) and their exits into RankExited
// reports, carries in-place recovery to them (AbortRanks and EnterEpoch, on
// their control streams through a RankControlSink) and pauses them when the
// agent's lease runs out (lease.h). No gRPC here; the session feeds it and
// forwards what it reports.
//
// Directory layout under the work dir, one per rank launched:
//   <work_dir>/jobs/<job_id>/attempt_<n>/rank_<r>/assignment.pb   (binary RankAssignment)
//   <work_dir>/jobs/<job_id>/attempt_<n>/rank_<r>/log.txt         (trainer stdout+stderr)
// Each rank directory is created fresh (mode 0700, never reused: a launch
// whose directory exists is refused) through O_NOFOLLOW opens, and its files
// are created with O_EXCL | O_NOFOLLOW, so nothing planted there is followed
// or truncated. Before a rank starts, its assignment is confined to this
// node's roots (launch_paths.h); the rank directory, its assignment and the
// job's checkpoint directory belong to the user the rank runs as
// (rank_user.h: under --run_as_uid_range, the job's own uid).
//
// A survivor that EnterEpoch moves from attempt n to m keeps its process, its
// directory (still named attempt_<n>, where it was launched) and its log;
// from then on its token, store namespace, progress, exit report and
// RunningRank are attempt m's, and its old token opens nothing.
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "loom/v1/node.pb.h"
#include "worker/agent/launch_paths.h"
#include "worker/agent/lease.h"
#include "worker/agent/process_supervisor.h"
#include "worker/agent/rank_commands.h"
#include "worker/agent/rank_control_sink.h"
#include "worker/agent/rank_tokens.h"
#include "worker/agent/rank_user.h"

namespace loom::agent {

struct RankManagerOptions {
  std::string work_dir;      // absolute
  std::string trainer_path;  // the loom-trainer executable
  // The agent's endpoint (progress and the rendezvous store), handed to every
  // trainer (--agent_socket), the only endpoint a trainer talks to; e.g.
  // "unix:<work_dir>/agent.sock".
  std::string agent_socket;
  int threads_per_rank = 1;  // OMP_NUM_THREADS / OPENBLAS_NUM_THREADS of each rank
  // GPU nodes: each rank sees only its assigned GPU (CUDA_VISIBLE_DEVICES =
  // the assignment's local_device), so every rank uses its device 0.
  bool gpu_devices = false;
  absl::Duration default_grace = absl::Seconds(5);  // when a kill names none
  // Where ranks may read data and keep checkpoints; with no data roots every
  // data path is refused (an empty spec path passes).
  LaunchRoots roots;
  // --run_as_user: ranks run as this user and own their rank and checkpoint
  // directories; -1: as this process.
  confine::FileOwner run_as;
  // --run_as_uid_range: each job's ranks run as the job's own uid from this
  // range (rank_user.h), in place of run_as; a job without one is refused.
  std::optional<confine::UidRange> job_uids;
  // The agent's lease (none: ranks are never fenced) and the ranks' control
  // streams (none: aborts and epochs are applied but told to no one). Both
  // outlive the manager.
  Lease* lease = nullptr;
  RankControlSink* control = nullptr;
};

// The exit code reported for a rank that could not be started at all.
inline constexpr int kLaunchFailedExitCode = 127;

class RankManager : public RankCommands, public RankTokens {
 public:
  // Called once per launched rank when it has ended (from the supervision
  // thread), and for a launch that failed. Must not call back into the manager.
  using ExitSink = std::function<void(loom::v1::RankExited)>;

  RankManager(RankManagerOptions options, ExitSink sink);
  ~RankManager() override;  // kills what is still running (default grace)

  // Writes the assignment file and starts the trainer. A rank that cannot be
  // started is reported through the sink (exit code 127, the reason in
  // log_tail and in log.txt) and the error is returned. A rank of the same
  // job, attempt and number that is still running is left alone
  // (ALREADY_EXISTS, nothing reported).
  absl::Status Launch(const loom::v1::RankAssignment& assignment) override;

  // SIGTERM to the job's ranks (one attempt, or all when attempt == 0; only
  // the listed rank numbers when kill.ranks is set), SIGKILL after
  // grace_seconds (the default grace when it is <= 0; at once for a paused
  // rank). Returns how many ranks were signalled.
  int Kill(const loom::v1::KillRanks& kill) override;

  // Pushes the AbortRanks to each rank of that job and attempt.
  int Abort(const loom::v1::AbortRanks& abort) override;
  int Stop(const loom::v1::StopRanks& stop) override;
  // Every rank of every job on this node stops gracefully (the agent drains
  // on SIGTERM): each job agrees to stop after its next step and saves it.
  int StopAll(const std::string& reason);

  // Pushes the TraceStep to each listed rank (every one when none are) of
  // that job and attempt.
  int Trace(const loom::v1::TraceStep& trace) override;

  // For each listed rank of (job, from_attempt): moves it to `attempt`, with
  // the entry's token and the epoch's store namespace, at once (its old token
  // is refused from now on), then pushes it the EnterEpoch with its own entry
  // only. A rank already in `attempt` with that token is left alone (a
  // repeated message); one not found, or whose place in the new attempt is
  // taken, is skipped with a log line.
  int EnterEpoch(const loom::v1::EnterEpoch& epoch) override;

  // SIGCONT to each listed rank (job, attempt, rank; and pid when it is set)
  // that is paused; it may relay again once the lease runs.
  int Resume(const loom::v1::ResumeRanks& resume) override;

  // The lease ran out: SIGSTOP to every rank fenced by it (all that were
  // launched or resumed before). Returns how many were stopped now.
  int PauseAll();

  std::vector<loom::v1::RunningRank> Running() const override;

  // A rank launched here and not yet ended, by its current token (constant
  // time), or by its launch id.
  std::optional<RankIdentity> RankForToken(std::string_view token) const override;
  std::optional<RankIdentity> RankForLaunch(uint64_t launch_id) const override;

  // Refuses further launches, kills every rank (SIGTERM, SIGKILL after
  // grace) and returns once all have been reported.
  void Shutdown(absl::Duration grace);

  // The directory a launch of (job, attempt, rank) gets.
  std::string RankDir(const std::string& job_id, int attempt, int rank) const;

  // Bytes of the log of rank `rank` in `attempt` (ReadRankLog, for `loomctl
  // logs`), read through log_tail.h's ReadLogBeneath: the log of the process
  // that runs or ran it in that attempt, which for a survivor moved there by
  // EnterEpoch is in the directory of the attempt it was launched in. The
  // answer says whether that process still runs; an error is in error_code.
  loom::v1::RankLogChunk ReadLog(const loom::v1::ReadRankLog& request) const;

 private:
  using Key = std::tuple<std::string, int, int>;  // job_id, attempt (current), rank
  struct Rank {
    uint64_t id = 0;  // launch id
    pid_t pid = 0;    // 0 while the launch is in flight
    std::string log_path;
    std::string token;  // the current attempt's rank token (secret)
    std::string store_namespace;
    uint64_t lease_generation = 0;  // stamped at launch and resume (lease.h)
    bool stopped = false;           // SIGSTOP sent, no SIGCONT since
  };

  // The lease's state now (never expired without a lease).
  Lease::State LeaseState() const;
  static RankIdentity Identity(const Key& key, const Rank& rank, const Lease::State& lease);
  // Fenced: launched or resumed before the lease's latest run-out, or the
  // lease has run out now.
  static bool Paused(const Rank& rank, const Lease::State& lease) {
    return rank.stopped || lease.expired || rank.lease_generation != lease.generation;
  }

  void ReportLaunchFailure(const loom::v1::RankAssignment& assignment,
                           const std::string& log_path, const std::string& reason,
                           int exit_code = kLaunchFailedExitCode);

  const RankManagerOptions options_;
  const ExitSink sink_;

  // Held across a pause or resume (table and signal), so SIGSTOP and SIGCONT
  // reach a rank in the order the table says; taken before mu_.
  absl::Mutex signal_mu_;
  mutable absl::Mutex mu_;  // before the lease's: RankManager -> Lease, never back
  std::map<Key, Rank> ranks_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Key> keys_ ABSL_GUARDED_BY(mu_);  // launch id -> its current key
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;

  ProcessSupervisor supervisor_;  // last: destroyed (and its children killed) first
};

// "jobs/<job_id>/attempt_<n>/rank_<r>/log.txt": a rank's log beneath the work dir.
std::string RankLogRelative(const std::string& job_id, int attempt, int rank);

// A job id is used as a directory name: letters, digits, '.', '_', '-'.
absl::Status ValidateJobId(const std::string& job_id);

}  // namespace loom::agent
