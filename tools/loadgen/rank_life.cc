#include "tools/loadgen/rank_life.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace loom::loadgen {
namespace {

using loom::v1::RankProgress;
using loom::v1::RestorePlan;

// The steps of [from, step] a rank holds after completing `step`: the two
// newest, none before `from` or before step 1.
std::vector<int64_t> HeldSteps(int64_t from, int64_t step) {
  std::vector<int64_t> steps;
  for (int64_t s = std::max({from, step - 1, int64_t{1}}); s <= step; ++s) steps.push_back(s);
  return steps;
}

bool Holds(const std::vector<int64_t>& steps, int64_t step) {
  return std::find(steps.begin(), steps.end(), step) != steps.end();
}

}  // namespace

RankLife::RankLife(const loom::v1::RankAssignment& a)
    : job_id_(a.job_id()),
      rank_(a.rank()),
      world_size_(a.world_size()),
      local_device_(a.local_device()),
      // loom-trainer's default when the assignment sets none.
      collective_timeout_s_(a.collective_timeout_s() > 0 ? a.collective_timeout_s() : 60),
      attempt_(a.attempt()),
      rank_token_(a.rank_token()),
      store_namespace_(a.store_namespace()),
      ward_rank_(a.has_snapshots() ? a.snapshots().ward_rank() : -1) {
  if (a.restore().source() != RestorePlan::CHECKPOINT) {
    // Relaunched: it holds the snapshot it restored (from its old buddy) and
    // nothing of its ward's until the ward's next copy.
    base_step_ = a.restore().step();
    own_from_ = base_step_;
    ward_from_ = base_step_ + 1;
  }
  last_reported_ = base_step_;
  completed_ = base_step_;
}

loom::v1::StoreOp RankLife::Op() const {
  loom::v1::StoreOp op;
  op.set_rank_token(rank_token_);
  return op;
}

loom::v1::StoreOp RankLife::Begin() {
  phase_ = Phase::kJoining;
  loom::v1::StoreOp op = Op();
  loom::v1::StoreSetRequest* set = op.mutable_set();
  set->set_store_namespace(store_namespace_);
  set->set_key(rpc::RankEntryKey(rank_, kAddressEntry));
  set->set_value(absl::StrCat("127.0.0.1:", 20000 + local_device_));
  return op;
}

loom::v1::StoreOp RankLife::JoinOp() const {
  loom::v1::StoreOp op = Op();
  loom::v1::StoreAddRequest* add = op.mutable_add();
  add->set_store_namespace(store_namespace_);
  add->set_key(std::string(kJoinedKey));
  add->set_delta(1);
  return op;
}

loom::v1::StoreOp RankLife::ReleaseOp() const {
  loom::v1::StoreOp op = Op();
  loom::v1::StoreSetRequest* set = op.mutable_set();
  set->set_store_namespace(store_namespace_);
  set->set_key(kGoKey);
  set->set_value("1");
  return op;
}

void RankLife::PassedBarrier() {
  if (phase_ == Phase::kJoining) phase_ = Phase::kJoined;
}

void RankLife::Stamp(RankProgress* out, int64_t now_us) const {
  out->set_job_id(job_id_);
  out->set_attempt(attempt_);
  out->set_rank(rank_);
  out->set_time_unix_ms(now_us / 1000);
  out->set_time_unix_us(now_us);  // as loom-trainer stamps it
}

void RankLife::FillReady(RankProgress* out, int64_t now_us) const {
  Stamp(out, now_us);
  out->set_phase("ready");
}

void RankLife::FillResumed(RankProgress* out, int64_t now_us) {
  Stamp(out, now_us);
  out->set_phase("resumed");
  out->set_step(base_step_);
  out->set_resumed_step(base_step_);
  phase_ = Phase::kRunning;
}

bool RankLife::HasNewStep(const JobClock::View& clock) const {
  return phase_ == Phase::kRunning && clock.attempt == attempt_ && clock.step > base_step_ &&
         clock.step > last_reported_;
}

bool RankLife::FillStep(RankProgress* out, const JobClock::View& clock, int64_t now_us) {
  Stamp(out, now_us);
  if (HasNewStep(clock)) {
    const int64_t step = clock.step;
    out->set_phase("step");
    out->set_step(step);
    out->set_loss(5.0 / static_cast<double>(step));
    out->set_tokens(step * 4096 * static_cast<int64_t>(world_size_));
    out->set_step_seconds(1.0);
    out->set_tokens_per_second(4096.0 * world_size_);
    out->set_memory_bytes(int64_t{40} << 30);
    out->set_flops_per_token(6e9);
    out->set_lr(3e-4);
    out->set_grad_norm(1.0);
    // As loom-trainer's step reports carry them (RankProgress.snapshots).
    Holdings(step, out->mutable_snapshots());
    last_reported_ = step;
    const bool first = !past_first_step_;
    past_first_step_ = true;
    return first;
  }
  // Waiting in the data-parallel all-reduce of the next step: for a peer
  // that failed or stopped (the clock froze), or for the ranks still
  // restoring.
  const int64_t since_ms = clock.frozen ? absl::ToUnixMillis(clock.frozen_since) : now_us / 1000;
  out->set_phase("forward_backward");
  out->set_step(last_reported_);
  out->set_micro_batch(0);
  out->set_phase_since_unix_ms(since_ms);
  loom::v1::GroupProgress* group = out->add_groups();
  group->set_group("dp");
  group->set_issued(last_reported_ + 1);
  group->set_completed(last_reported_);
  group->set_current_op("all_reduce");
  group->set_current_since_unix_ms(since_ms);
  return false;
}

void RankLife::FillAborted(RankProgress* out, int64_t now_us) {
  Stamp(out, now_us);
  out->set_phase("aborted");  // loom-trainer's PhaseReport("aborted", last step)
  out->set_step(completed_);
  Holdings(completed_, out->mutable_snapshots());
  abort_pending_ = false;
}

bool RankLife::Abort(int32_t attempt, int64_t completed_step) {
  if (!alive() || attempt != attempt_ || phase_ == Phase::kAborted) return false;
  completed_ = phase_ == Phase::kRunning ? std::max({completed_step, last_reported_, base_step_})
                                         : base_step_;
  phase_ = Phase::kAborted;
  abort_pending_ = true;
  return true;
}

absl::Status RankLife::Enter(const loom::v1::EnterEpoch& epoch, const loom::v1::RankEpoch& entry,
                             std::vector<int32_t>* copies_not_held) {
  if (!alive()) return absl::FailedPreconditionError(absl::StrCat("rank ", rank_, " has exited"));
  if (epoch.job_id() != job_id_ || epoch.from_attempt() != attempt_ ||
      epoch.attempt() <= attempt_ || entry.rank() != rank_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "EnterEpoch of job ", epoch.job_id(), " from attempt ", epoch.from_attempt(), " to ",
        epoch.attempt(), " for rank ", entry.rank(), " does not apply to rank ", rank_, " of job ",
        job_id_, " in attempt ", attempt_));
  }
  // EnterEpoch implies the abort: a rank still running leaves after what it
  // reported.
  if (phase_ != Phase::kAborted) completed_ = std::max(last_reported_, base_step_);
  const int64_t restore = epoch.restore_step();
  const std::vector<int64_t> own = OwnSteps(completed_);
  if (!Holds(own, restore)) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank_, " is to roll back to its snapshot of step ", restore,
                     " but holds its own snapshots of steps [", absl::StrJoin(own, ", "), "]"));
  }
  const std::vector<int64_t> ward = WardSteps(completed_);
  for (int32_t to : entry.snapshots().send_snapshot_to()) {
    if (to != ward_rank_ || !Holds(ward, restore)) copies_not_held->push_back(to);
  }
  const int32_t new_ward = entry.has_snapshots() ? entry.snapshots().ward_rank() : -1;
  ward_from_ = new_ward >= 0 && new_ward == ward_rank_ ? restore : restore + 1;
  own_from_ = restore;
  ward_rank_ = new_ward;
  attempt_ = epoch.attempt();
  rank_token_ = entry.rank_token();
  store_namespace_ = epoch.store_namespace();
  base_step_ = restore;
  last_reported_ = restore;
  completed_ = restore;
  phase_ = Phase::kLaunched;
  carried_ = true;
  abort_pending_ = false;
  past_first_step_ = false;
  aborted_since_ = absl::InfiniteFuture();
  return absl::OkStatus();
}

std::vector<int64_t> RankLife::OwnSteps(int64_t step) const { return HeldSteps(own_from_, step); }

std::vector<int64_t> RankLife::WardSteps(int64_t step) const {
  if (ward_rank_ < 0) return {};
  return HeldSteps(ward_from_, step);
}

void RankLife::Holdings(int64_t step, loom::v1::SnapshotHoldings* out) const {
  out->Clear();
  for (int64_t s : OwnSteps(step)) out->add_own_steps(s);
  out->set_ward_rank(ward_rank_);
  for (int64_t s : WardSteps(step)) out->add_ward_steps(s);
  out->set_snapshot_bytes(kSnapshotBytes);
}

}  // namespace loom::loadgen
