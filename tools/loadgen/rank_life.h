// One simulated rank's life across attempts, as loom-trainer lives it
// (worker/trainer/rank_epochs.h), without a process: what it stores in the
// rendezvous, what it reports, and how it leaves an attempt and enters the
// next (docs/fault_tolerance.md, "In-place recovery"):
//
//   kLaunched --(its address set, join add, barrier)--> kJoining --> kJoined
//   kJoined: "ready" and "resumed" go in its node's next batch --> kRunning
//   kRunning: a step report whenever the job's clock completed a new step
//   AbortRanks of its attempt (from any phase but kExited) --> kAborted:
//     "aborted" with its SnapshotHoldings goes in the node's next batch
//   EnterEpoch naming it (from kAborted, or any live phase: it implies the
//     abort) --> kLaunched in the new attempt: new token, namespace, ring,
//     base step = the restore step (its own snapshot must hold it)
//   a kill, a crash or its node lost --> kExited
//
// Snapshots are simulated by the steps they hold: after completing step s a
// rank holds its own snapshots of s-1 and s and its ward's copies of the
// same steps (a synchronous job's ranks complete the same steps), never
// from before the attempt's base (a relaunched rank holds only what it
// restored; a rank whose ward is new holds no copy of it yet).
//
// Pure: the node (fake_node.h) calls it under its lock and does the talking.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/rpc/rank_entries.h"
#include "loom/v1/node.pb.h"
#include "loom/v1/rank.pb.h"
#include "tools/loadgen/job_clock.h"

namespace loom::loadgen {

class RankLife {
 public:
  enum class Phase { kLaunched, kJoining, kJoined, kRunning, kAborted, kExited };

  // The rendezvous keys of every attempt (in the attempt's own namespace):
  // its address is its rank entry (common/rpc/rank_entries.h), the join
  // count the store's.
  static constexpr std::string_view kJoinedKey = rpc::kJoinedKey;
  static constexpr char kGoKey[] = "loadgen/go";
  static constexpr char kAddressEntry[] = "addr";
  // What a snapshot of a rank is said to weigh (SnapshotHoldings.snapshot_bytes).
  static constexpr int64_t kSnapshotBytes = int64_t{1} << 30;

  // A launch (first, relaunched, or a whole-job restart): the restore plan
  // gives the base step (CHECKPOINT: 0, the simulated job keeps none).
  explicit RankLife(const loom::v1::RankAssignment& assignment);

  const std::string& job_id() const { return job_id_; }
  int32_t rank() const { return rank_; }
  int32_t attempt() const { return attempt_; }
  int world_size() const { return world_size_; }
  int64_t base_step() const { return base_step_; }
  int32_t ward_rank() const { return ward_rank_; }
  const std::string& store_namespace() const { return store_namespace_; }
  const std::string& rank_token() const { return rank_token_; }
  Phase phase() const { return phase_; }
  bool alive() const { return phase_ != Phase::kExited; }
  bool running() const { return phase_ == Phase::kRunning; }
  // "aborted" waits to be reported.
  bool abort_pending() const { return abort_pending_; }
  // Whether it reported a step past its attempt's base yet.
  bool past_first_step() const { return past_first_step_; }

  // The rendezvous: Begin (kLaunched -> kJoining) gives the set of its
  // address; then the join add; the rank whose add reached world_size sets
  // the "go" key (ReleaseOp), the others wait for it; PassedBarrier ->
  // kJoined. Each op carries this attempt's token and namespace.
  // A survivor that entered an attempt placed in place is already in its
  // namespace (the coordinator carried its address and counted it): it
  // begins with BeginCarried and only waits for "go".
  loom::v1::StoreOp Begin();
  bool carried() const { return carried_; }
  void BeginCarried() { phase_ = Phase::kJoining; }
  loom::v1::StoreOp JoinOp() const;
  bool IsLastJoiner(int64_t joined) const { return joined == world_size_; }
  loom::v1::StoreOp ReleaseOp() const;
  void PassedBarrier();

  // Its reports, into reused messages (the node's batch). Ready and resumed
  // go together (restoring is instant here) and move it to kRunning.
  void FillReady(loom::v1::RankProgress* out, int64_t now_us) const;
  void FillResumed(loom::v1::RankProgress* out, int64_t now_us);
  // A running rank's report on the clock: a step report when the clock
  // completed a step it has not reported (true: its first past the base),
  // else where it waits (the all-reduce of the next step).
  bool FillStep(loom::v1::RankProgress* out, const JobClock::View& clock, int64_t now_us);
  // Whether the clock completed a step of its attempt that it has not reported.
  bool HasNewStep(const JobClock::View& clock) const;
  void FillAborted(loom::v1::RankProgress* out, int64_t now_us);

  // AbortRanks for its attempt: it leaves its collectives after
  // `completed_step` (the newest step it completed) and owes an "aborted"
  // report. False when the abort is not for it (another attempt, exited).
  bool Abort(int32_t attempt, int64_t completed_step);

  // EnterEpoch with its own entry: it moves to the next attempt. An error
  // (it holds no snapshot of the restore step, or the epoch is not from its
  // attempt) means the rank cannot go on: loom-trainer exits 1 then.
  // copies_not_held: the relaunched ranks it was told to send a copy to of
  // which it holds none (it was not their buddy, or not at that step).
  absl::Status Enter(const loom::v1::EnterEpoch& epoch, const loom::v1::RankEpoch& entry,
                     std::vector<int32_t>* copies_not_held);

  void Exit() { phase_ = Phase::kExited; }
  // When it went kAborted (it gives up on the next attempt after the
  // collective timeout, as loom-trainer exits 4).
  absl::Time aborted_since() const { return aborted_since_; }
  void set_aborted_since(absl::Time t) { aborted_since_ = t; }
  double collective_timeout_s() const { return collective_timeout_s_; }

  // What it holds after completing `step`.
  void Holdings(int64_t step, loom::v1::SnapshotHoldings* out) const;
  std::vector<int64_t> OwnSteps(int64_t step) const;
  std::vector<int64_t> WardSteps(int64_t step) const;

  // The agent's lease generation it was launched or resumed in (lease.h):
  // paused while the lease's generation is newer.
  uint64_t lease_generation() const { return lease_generation_; }
  void set_lease_generation(uint64_t g) { lease_generation_ = g; }
  // A stopped process (--stop_rank): it sends and answers nothing.
  bool silent() const { return silent_; }
  void set_silent() { silent_ = true; }
  int32_t pid() const { return pid_; }
  void set_pid(int32_t pid) { pid_ = pid; }
  int32_t local_device() const { return local_device_; }

 private:
  loom::v1::StoreOp Op() const;
  void Stamp(loom::v1::RankProgress* out, int64_t now_us) const;

  // Fixed for the process.
  std::string job_id_;
  int32_t rank_ = 0;
  int world_size_ = 0;
  int32_t local_device_ = 0;
  double collective_timeout_s_ = 0;
  // The current attempt.
  int32_t attempt_ = 0;
  std::string rank_token_;
  std::string store_namespace_;
  int32_t ward_rank_ = -1;
  int64_t base_step_ = 0;
  int64_t own_from_ = 1;   // its oldest own snapshot that can exist
  int64_t ward_from_ = 1;  // its ward's oldest copy it can hold
  Phase phase_ = Phase::kLaunched;
  int64_t last_reported_ = 0;  // the newest step it reported in this attempt
  int64_t completed_ = 0;      // the newest step it completed (set by Abort)
  bool abort_pending_ = false;
  bool past_first_step_ = false;
  absl::Time aborted_since_ = absl::InfiniteFuture();
  uint64_t lease_generation_ = 0;
  bool silent_ = false;
  int32_t pid_ = 0;
  bool carried_ = false;  // entered the current attempt by EnterEpoch
};

}  // namespace loom::loadgen
