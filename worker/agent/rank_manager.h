// The agent's ranks: turns LaunchRank and KillRanks commands into trainer
// processes (through ProcessSupervisor) and their exits into RankExited
// reports. No gRPC here; the session feeds it and forwards what it reports.
//
// Directory layout under the work dir, one per rank of a job attempt:
//   <work_dir>/jobs/<job_id>/attempt_<n>/rank_<r>/assignment.pb   (binary RankAssignment)
//   <work_dir>/jobs/<job_id>/attempt_<n>/rank_<r>/log.txt         (trainer stdout+stderr)
// Each rank directory is created fresh (mode 0700, never reused: a launch
// whose directory exists is refused) through O_NOFOLLOW opens, and its files
// are created with O_EXCL | O_NOFOLLOW, so nothing planted there is followed
// or truncated. Before a rank starts, its assignment is confined to this
// node's roots (launch_paths.h).
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "loom/v1/node.pb.h"
#include "worker/agent/launch_paths.h"
#include "worker/agent/process_supervisor.h"
#include "worker/agent/rank_commands.h"
#include "worker/agent/rank_tokens.h"

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

  // SIGTERM to the job's ranks (one attempt, or all when attempt == 0),
  // SIGKILL after grace_seconds (the default grace when it is <= 0).
  // Returns how many ranks were signalled.
  int Kill(const loom::v1::KillRanks& kill) override;

  std::vector<loom::v1::RunningRank> Running() const override;

  // A rank launched here and not yet ended, by its token (constant time).
  std::optional<RankIdentity> RankForToken(std::string_view token) const override;

  // Refuses further launches, kills every rank (SIGTERM, SIGKILL after
  // grace) and returns once all have been reported.
  void Shutdown(absl::Duration grace);

  std::string RankDir(const std::string& job_id, int attempt, int rank) const;

 private:
  using Key = std::tuple<std::string, int, int>;  // job_id, attempt, rank
  struct Rank {
    pid_t pid = 0;  // 0 while the launch is in flight
    std::string log_path;
    std::string token;  // the assignment's rank_token (secret)
    std::string store_namespace;
  };

  void ReportLaunchFailure(const loom::v1::RankAssignment& assignment,
                           const std::string& log_path, const std::string& reason,
                           int exit_code = kLaunchFailedExitCode);

  const RankManagerOptions options_;
  const ExitSink sink_;

  mutable absl::Mutex mu_;
  std::map<Key, Rank> ranks_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;

  ProcessSupervisor supervisor_;  // last: destroyed (and its children killed) first
};

// A job id is used as a directory name: letters, digits, '.', '_', '-'.
absl::Status ValidateJobId(const std::string& job_id);

}  // namespace loom::agent
