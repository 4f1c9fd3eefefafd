// A coordinated rank's life as a loop over attempts (in-place recovery,
// docs/fault_tolerance.md): in each attempt it builds its groups in the
// attempt's store namespace with the attempt's token, gets its state as the
// RestorePlan says (the newest checkpoint; its own in-memory snapshot of the
// restore step; or, relaunched, the copy its old buddy sends), sends the
// restore copies it owes relaunched ranks, reports ready and resumed, and
// trains, snapshotting and copying to its buddy as it goes. When the
// coordinator aborts the attempt (AbortRanks on the control channel) or one
// of its collectives fails on its own (a peer died), it aborts every
// communicator of the attempt, unwinds to between steps, reports "aborted"
// with the snapshots it holds and waits for EnterEpoch: then it discards the
// old groups and runs the next attempt. No EnterEpoch within the collective
// timeout: DEADLINE_EXCEEDED (exit code 4). Without in-place recovery
// (fault_tolerance.in_place false or snapshot_interval 0) a failure ends the
// rank as before.
//
// What talks to the world (the agent's store and progress stream, the GPU's
// groups, the fault drills) comes in a RankWorld, so the same loop runs over
// the agent (coordinated.cc) and in a test (ranks as threads, in-process
// store, control messages posted to the mailbox).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "common/spec/job_spec.h"
#include "kernels/ops.h"
#include "loom/v1/rank.pb.h"
#include "worker/comm/store.h"
#include "worker/trainer/attempt_groups.h"
#include "worker/trainer/control_mailbox.h"
#include "worker/trainer/progress_sink.h"

namespace loom::trainer {

struct RankWorld {
  // The attempt's rendezvous store: its namespace, opened with its token.
  std::function<std::unique_ptr<comm::Store>(const std::string& store_namespace,
                                             const std::string& rank_token)>
      open_store;
  // Where the attempt's progress reports go.
  std::function<std::unique_ptr<ProgressSink>(int attempt, const std::string& rank_token)>
      open_progress;
  // The training groups (Gloo or NCCL); the pair groups are always Gloo.
  GroupFactory make_group;
  // Told when the rank enters an attempt (the control stream's token, the
  // attempt's fault drills).
  std::function<void(int attempt, const std::string& rank_token)> on_attempt;
  // After every completed step, before it is reported (fault drills); an
  // error ends the rank with it.
  std::function<absl::Status(int64_t step)> after_step;
  // Log lines (stderr in a real rank).
  std::function<void(const std::string&)> on_event;
  // Rank 0's progress line after each step (stderr in a real rank).
  std::function<void(const std::string&)> on_step_line;
  // The control channel; null: none (no abort orders, no next attempt).
  ControlMailbox* control = nullptr;
  // The backend, made once for every attempt.
  std::shared_ptr<kernels::Ops> ops;
  // The address this rank binds for its Gloo groups.
  std::string address = "127.0.0.1";
  // Health reports and the collective watchdog (rank_monitor.h) while training.
  bool monitor = true;
};

// `first`: the assignment the rank was launched with; `job`: its resolved
// spec with data paths made absolute. Returns when the job is done (OK), or
// with the error that ends the rank.
absl::Status RunRankEpochs(const loom::v1::RankAssignment& first, const spec::JobSpec& job,
                           RankWorld& world);

// Whether a failed attempt's status is one the rank can leave in place
// (a collective or rendezvous that failed, was aborted or timed out), rather
// than an error of its own that ends it.
bool IsAttemptFailure(const absl::Status& status);

}  // namespace loom::trainer
