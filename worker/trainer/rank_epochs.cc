#include "worker/trainer/rank_epochs.h"

#include <algorithm>
#include <atomic>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/topology/instruction.h"
#include "worker/engine/snapshot_keeper.h"
#include "worker/trainer/fault_injection.h"
#include "worker/engine/training_loop.h"
#include "worker/engine/training_run.h"
#include "worker/trainer/commit_gate.h"
#include "worker/trainer/rank_monitor.h"
#include "worker/trainer/rank_reports.h"
#include "worker/trainer/spill_snapshots.h"
#include "worker/trainer/stopped_status.h"
#include "worker/trainer/step_trace.h"

namespace loom::trainer {
namespace {

using loom::v1::RestorePlan;

// What one attempt is for this rank.
struct AttemptPlan {
  int attempt = 0;
  std::string store_namespace;
  std::string rank_token;
  loom::v1::SnapshotRing ring;
  RestorePlan restore;
};

AttemptPlan FirstPlan(const loom::v1::RankAssignment& a) {
  AttemptPlan plan;
  plan.attempt = a.attempt();
  plan.store_namespace = a.store_namespace();
  plan.rank_token = a.rank_token();
  plan.restore = a.restore();
  if (a.has_snapshots()) {
    plan.ring = a.snapshots();
  } else {  // an assignment without a ring: no buddy, no ward
    plan.ring.set_buddy_rank(-1);
    plan.ring.set_ward_rank(-1);
  }
  return plan;
}

// A survivor's next attempt: its own snapshot of the restore step.
absl::StatusOr<AttemptPlan> NextPlan(const loom::v1::EnterEpoch& e, int rank) {
  for (const loom::v1::RankEpoch& entry : e.ranks()) {
    if (entry.rank() != rank) continue;
    AttemptPlan plan;
    plan.attempt = e.attempt();
    plan.store_namespace = e.store_namespace();
    plan.rank_token = entry.rank_token();
    plan.ring = entry.snapshots();
    plan.restore.set_source(RestorePlan::OWN_SNAPSHOT);
    plan.restore.set_step(e.restore_step());
    return plan;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("EnterEpoch of attempt ", e.attempt(), " has no entry for rank ", rank));
}

// The ranks this one shares a pair group with in the attempt.
std::vector<int> PairPeers(const AttemptPlan& p) {
  std::vector<int> peers = {p.ring.buddy_rank(), p.ring.ward_rank()};
  if (p.restore.source() == RestorePlan::PEER_SNAPSHOT) peers.push_back(p.restore.peer_rank());
  for (int to : p.ring.send_snapshot_to()) peers.push_back(to);
  return peers;
}

// [pp] The layers the coordinator assigned must be the ones this rank's stage
// derived from the spec (the same partition); an empty list is not checked.
absl::Status CheckStageLayers(const loom::v1::RankAssignment& a, engine::TrainingLoop& loop,
                              const RankWorld& world) {
  if (loop.pipeline_stage() == nullptr || a.layers().empty()) return absl::OkStatus();
  const std::vector<int64_t> mine = engine::StageLayers(loop.pipeline_stage()->plan());
  const std::vector<int64_t> given(a.layers().begin(), a.layers().end());
  if (mine != given) {
    return absl::FailedPreconditionError(
        absl::StrCat("assignment of rank ", a.rank(), ": layers [", absl::StrJoin(given, ","),
                     "] differ from pipeline stage ", loop.pipeline_stage()->plan().stage,
                     "'s partition [", absl::StrJoin(mine, ","), "]"));
  }
  // The instruction list the coordinator derived is the one this stage runs.
  const std::string list = topology::FormatInstructions(loop.pipeline_stage()->plan().instructions);
  if (!a.pipeline_instructions().empty() && a.pipeline_instructions() != list) {
    return absl::FailedPreconditionError(absl::StrCat(
        "assignment of rank ", a.rank(), ": pipeline instructions '", a.pipeline_instructions(),
        "' differ from stage ", loop.pipeline_stage()->plan().stage, "'s schedule '", list, "'"));
  }
  if (world.on_event) {
    world.on_event(absl::StrFormat("pipeline stage %d, layers [%s], bubble %.3f: %s",
                                   loop.pipeline_stage()->plan().stage, absl::StrJoin(mine, ","),
                                   a.pipeline_bubble_fraction(), list));
  }
  return absl::OkStatus();
}

// A restore that cannot be done is not the job's fault (exit code 3 would
// fail the job at once): the rank ends as crashed, and the coordinator falls
// back to restarting the whole job. A failed transfer stays what it is.
absl::Status RestoreFailure(const absl::Status& s, const std::string& what) {
  if (s.ok() || IsAttemptFailure(s)) return s;
  return absl::InternalError(absl::StrCat(what, ": ", s.message()));
}

// The commit gate's retries: the other ranks wait in a collective meanwhile.
CommitGateOptions GateOptions(absl::Duration collective_timeout) {
  CommitGateOptions gate;
  gate.retry_for = std::min(absl::Seconds(30), collective_timeout / 2);
  return gate;
}

// One attempt's state, torn down in a fixed order whatever happened
// (TearDown, below).
struct Attempt {
  std::shared_ptr<comm::CommunicatorSet> set = std::make_shared<comm::CommunicatorSet>();
  std::unique_ptr<comm::Store> store;
  AttemptGroups groups;
  std::unique_ptr<engine::TrainingLoop> loop;
  PhaseBoard board;
  std::unique_ptr<RankMonitor> monitor;
  std::atomic<int64_t> last_step{0};
  // The graceful stop the job agreed on: after which step, and why.
  std::optional<std::pair<int64_t, std::string>> stopped;
  // `loomctl trace`: shared with the clock's observer, which the groups may
  // outlive the attempt with.
  std::shared_ptr<StepTraceRecorder> trace = std::make_shared<StepTraceRecorder>();
};

absl::Status RunAttemptBody(const loom::v1::RankAssignment& a, const spec::JobSpec& job,
                            const AttemptPlan& plan, RankWorld& world,
                            engine::SnapshotKeeper* keeper, ProgressSink& progress, Attempt& at) {
  auto event = [&world](const std::string& message) {
    if (world.on_event) world.on_event(message);
  };
  const absl::Duration timeout =
      absl::Seconds(a.collective_timeout_s() > 0 ? a.collective_timeout_s() : 60);
  at.store = world.open_store(plan.store_namespace, plan.rank_token);
  comm::PairGroupOptions pairs;
  pairs.timeout = timeout;
  pairs.hostname = world.address;
  if (absl::Status s = BuildAttemptGroups(a, *at.store, world.make_group, PairPeers(plan), pairs,
                                          *at.set, &at.groups);
      !s.ok()) {
    return s;
  }
  const AttemptGroups& g = at.groups;
  const int dp_rank = static_cast<int>(a.coords().dp());
  const int dp_size = static_cast<int>(a.layout().dp() > 0 ? a.layout().dp() : 1);
  absl::StatusOr<engine::ParallelContext> ctx =
      engine::ParallelContext::Make(dp_rank, dp_size, g.dp, g.tp, g.pp, g.cp, g.dp_cp, g.ep);
  if (!ctx.ok()) return ctx.status();
  const RestorePlan::Source source = plan.restore.source();
  if (source != RestorePlan::CHECKPOINT && keeper == nullptr) {
    return absl::InternalError(absl::StrCat(
        "rank ", a.rank(), " is to restore an in-memory snapshot of step ", plan.restore.step(),
        ", but the job takes none (fault_tolerance.in_place false or snapshot_interval 0)"));
  }
  engine::LoopOptions loop_options;
  // A snapshot overwrites every parameter: no need to draw the random init.
  loop_options.initialize_parameters = source == RestorePlan::CHECKPOINT;
  absl::StatusOr<std::unique_ptr<engine::TrainingLoop>> loop =
      engine::TrainingLoop::Create(job, *ctx, world.ops, loop_options);
  if (!loop.ok()) return loop.status();
  at.loop = std::move(*loop);
  engine::TrainingLoop& l = *at.loop;
  if (absl::Status s = CheckStageLayers(a, l, world); !s.ok()) return s;  // [pp]
  // Bad-step drills (LOOM_TEST_FAULT nan_grad, loss_spike), of this attempt.
  absl::StatusOr<engine::StepFaults> faults = StepFaultsFor(a.rank(), plan.attempt);
  if (!faults.ok()) return faults.status();
  l.set_step_faults(*faults);
  if (ctx->ep != nullptr) {  // [ep] which experts this rank holds, for its log
    const int64_t held = job.model.moe.num_experts / ctx->ep_size();
    event(absl::StrCat("expert parallel: ep rank ", ctx->ep_rank(), " of ", ctx->ep_size(),
                       " holds experts [", ctx->ep_rank() * held, ", ", (ctx->ep_rank() + 1) * held,
                       ")"));
  }
  l.set_commit_gate(MakeStoreCommitGate(at.store.get(), GateOptions(timeout), event));
  progress.Report(PhaseReport("ready", 0));

  // The state: the newest checkpoint (RunTraining, below), or a snapshot.
  const int64_t restore_step = plan.restore.step();
  if (source == RestorePlan::OWN_SNAPSHOT) {
    if (absl::Status s = keeper->RestoreOwn(l, restore_step); !s.ok()) {
      return RestoreFailure(s, absl::StrCat("rolling back to step ", restore_step));
    }
    event(absl::StrCat("attempt ", plan.attempt, ": rolled back to its own snapshot of step ",
                       restore_step));
  } else if (source == RestorePlan::PEER_SNAPSHOT) {
    comm::Communicator* pair = g.pair(plan.restore.peer_rank());
    if (pair == nullptr) {
      return absl::InternalError(
          absl::StrCat("rank ", a.rank(), " is to receive its snapshot from rank ",
                       plan.restore.peer_rank(), ", which is not a peer it can pair with"));
    }
    if (absl::Status s = keeper->RestoreFromPeer(l, *pair, restore_step); !s.ok()) {
      return RestoreFailure(s, absl::StrCat("restoring step ", restore_step, " from rank ",
                                            plan.restore.peer_rank()));
    }
    event(absl::StrCat("attempt ", plan.attempt, ": restored its snapshot of step ", restore_step,
                       " from rank ", plan.restore.peer_rank()));
  }
  // The copies this rank owes relaunched ranks, before the first step.
  std::vector<int> owed;
  if (keeper != nullptr) {
    owed.assign(plan.ring.send_snapshot_to().begin(), plan.ring.send_snapshot_to().end());
  }
  for (int to : owed) {
    comm::Communicator* pair = g.pair(to);
    absl::Status sent = pair == nullptr ? absl::InvalidArgumentError(absl::StrCat(
                                              "rank ", to, " is not a peer it can pair with"))
                                        : keeper->SendCopyTo(*pair, to, restore_step);
    if (!sent.ok() && IsAttemptFailure(sent)) return sent;
    // Without the copy the relaunched rank fails, and with it this attempt.
    if (!sent.ok()) event(absl::StrCat("sending rank ", to, " its snapshot: ", sent.message()));
  }
  if (keeper != nullptr) {
    keeper->AttachRing(g.pair(plan.ring.buddy_rank()), g.pair(plan.ring.ward_rank()),
                       plan.ring.ward_rank());
  }

  at.board.Set("running");
  std::shared_ptr<StepTraceRecorder> trace = at.trace;
  l.set_phase_listener([&at, trace](const char* phase, int64_t micro_batch, int64_t chunk) {
    at.board.Set(phase, static_cast<int>(micro_batch), static_cast<int>(chunk));
    if (trace->recording()) trace->Phase(phase, micro_batch, chunk, absl::Now());
  });
  g.clock->set_observer([trace](const std::string& group, const char* op, absl::Time entered,
                                absl::Duration blocked, int64_t bytes) {
    if (trace->recording()) trace->Collective(group, op, entered, blocked, bytes, absl::Now());
  });
  // Step `step` begins now: recorded if `loomctl trace` asked for it.
  ControlMailbox* control = world.control;
  auto begin_step = [&g, trace, control](int64_t step) {
    const absl::Time now = absl::Now();
    g.clock->BeginStep(now);
    trace->BeginStep(step, control != nullptr && control->TraceWanted(step), now);
  };
  if (world.monitor) {
    at.monitor = std::make_unique<RankMonitor>(RankMonitorOptions{.collective_timeout = timeout},
                                               &progress, &at.board, g.training());
  }
  engine::RunOptions run;
  run.checkpoint_root = a.checkpoint_dir();
  run.resume_from = a.resume_from_dir();
  run.resume = source == RestorePlan::CHECKPOINT;
  run.on_event = event;
  run.snapshots = keeper;
  // The coordinator times a recovery's state load by these reports.
  run.on_resumed = [&progress, &at, trace, control](int64_t step) {
    at.last_step = step;
    // The step after the restored one is the first (the clock's step runs on
    // from before the load, as the straggler timing counts it).
    trace->BeginStep(step + 1, control != nullptr && control->TraceWanted(step + 1), absl::Now());
    progress.Report(PhaseReport("resumed", step));
  };
  run.on_step = [&](const engine::StepProgress& p) -> absl::Status {
    at.board.SetStep(p.step);
    at.last_step = p.step;
    if (world.after_step) {
      if (absl::Status s = world.after_step(p.step); !s.ok()) return s;
    }
    // Every rank: each has its own log, which `loomctl logs --rank=N` shows.
    if (world.on_step_line) world.on_step_line(engine::FormatProgressLine(p));
    loom::v1::RankProgress report = StepReport(p);
    // Waiting for the previous snapshot copy is waiting on a peer (the buddy
    // still receiving it), not this rank's compute: a stopped buddy must not
    // make its ward look like the straggler.
    if (p.snapshot.has_value() && p.snapshot->wait_seconds > 0) {
      const absl::Duration waited = absl::Seconds(p.snapshot->wait_seconds);
      g.clock->Record("snapshot", "wait_copy", absl::Now() - waited, waited);
    }
    SetTiming(g.clock->Summary(), report.mutable_timing());
    if (std::optional<loom::v1::StepTrace> t = trace->Finish(p.step, absl::Now())) {
      *report.mutable_trace() = *std::move(t);
    }
    progress.Report(std::move(report));
    begin_step(p.step + 1);
    return absl::OkStatus();
  };
  if (world.control != nullptr) {
    run.stop_requested = [&world] { return world.control->StopRequested(); };
    run.on_stopped = [&at](int64_t step, const std::string& why) {
      at.stopped.emplace(step, why);
    };
  }
  begin_step(l.step() + 1);
  if (absl::Status s = engine::RunTraining(l, run); !s.ok()) return s;
  if (at.stopped.has_value()) {
    event(absl::StrCat("stopped after step ", at.stopped->first, ": ", at.stopped->second));
    progress.Report(PhaseReport("stopped", at.stopped->first));
    return StoppedStatus(at.stopped->first, at.stopped->second);
  }
  loom::v1::RankProgress finished = PhaseReport("finished", l.step());
  if (keeper != nullptr) SetHoldings(keeper->Holdings(), finished.mutable_snapshots());
  progress.Report(std::move(finished));
  return absl::OkStatus();
}

}  // namespace

bool IsAttemptFailure(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kAborted:           // told to stop, or a peer's abort
    case absl::StatusCode::kUnavailable:       // a peer died (its connection closed)
    case absl::StatusCode::kDeadlineExceeded:  // a peer never answered
    case absl::StatusCode::kCancelled:         // the attempt's store namespace was closed
      return true;
    default:
      return false;
  }
}

namespace {

// The attempt's teardown: abort what is left of a failed attempt (so no
// thread waits in it), stop the ring's copies, then drop the loop before the
// groups it uses, and the groups before the store.
void TearDown(Attempt& at, bool failed, const std::string& reason, RankWorld& world,
              engine::SnapshotKeeper* keeper) {
  if (failed) at.set->Abort(reason);
  if (keeper != nullptr) keeper->DetachRing();
  at.monitor.reset();
  at.loop.reset();
  if (world.control != nullptr) world.control->Disarm();
  at.set.reset();
  at.store.reset();
}

// No room was left for the failed ranks: this survivor writes its part of
// the restore step as a checkpoint (spill_snapshots.h) in the attempt it
// aborted, and ends as stopped; the job restarts from that step.
absl::Status Spill(const loom::v1::StopRanks& order, const loom::v1::RankAssignment& first,
                   const spec::JobSpec& job, const AttemptPlan& plan, absl::Duration timeout,
                   RankWorld& world, engine::SnapshotKeeper& keeper) {
  std::unique_ptr<comm::Store> store = world.open_store(plan.store_namespace, plan.rank_token);
  SpillContext context;
  context.assignment = &first;
  context.job = &job;
  context.attempt = plan.attempt;
  context.ward_rank = plan.ring.ward_rank();
  context.store = store.get();
  context.gate = MakeStoreCommitGate(store.get(), GateOptions(timeout), world.on_event);
  context.timeout = timeout;
  context.on_event = world.on_event;
  if (absl::Status s = SpillSnapshots(order, keeper, context); !s.ok()) {
    return absl::InternalError(absl::StrCat("writing the in-memory snapshots of step ",
                                            order.spill_step(), " as a checkpoint: ", s.message()));
  }
  return StoppedStatus(order.spill_step(),
                       absl::StrCat("its in-memory snapshots of step ", order.spill_step(),
                                    " written as a checkpoint: ", order.reason()));
}

}  // namespace

absl::Status RunRankEpochs(const loom::v1::RankAssignment& first, const spec::JobSpec& job,
                           RankWorld& world) {
  auto event = [&world](const std::string& message) {
    if (world.on_event) world.on_event(message);
  };
  const bool in_place = job.fault_tolerance.in_place && job.fault_tolerance.snapshot_interval > 0;
  std::unique_ptr<engine::SnapshotKeeper> keeper;
  if (in_place) {
    engine::SnapshotKeeperOptions options;
    options.interval = job.fault_tolerance.snapshot_interval;
    options.rank = first.rank();
    options.on_event = event;
    keeper = std::make_unique<engine::SnapshotKeeper>(options);
  }
  const absl::Duration timeout =
      absl::Seconds(first.collective_timeout_s() > 0 ? first.collective_timeout_s() : 60);
  AttemptPlan plan = FirstPlan(first);
  while (true) {
    if (world.on_attempt) world.on_attempt(plan.attempt, plan.rank_token);
    std::unique_ptr<ProgressSink> progress = world.open_progress(plan.attempt, plan.rank_token);
    Attempt at;
    if (world.control != nullptr) world.control->Arm(plan.attempt, at.set);
    absl::Status status = RunAttemptBody(first, job, plan, world, keeper.get(), *progress, at);
    // Aborted from outside: whatever the body returned, the attempt is over.
    const bool aborted = at.set->aborted();
    const bool failed = !status.ok();
    const std::string reason =
        aborted ? at.set->abort_reason()
                : absl::StrCat("attempt ", plan.attempt, " failed: ", status.message());
    const int64_t last_step = at.last_step;
    TearDown(at, failed && !IsStopped(status), reason, world, keeper.get());
    if (status.ok() || IsStopped(status)) {
      progress->Flush(absl::Seconds(10));
      return status;
    }
    if (!in_place || world.control == nullptr || (!aborted && !IsAttemptFailure(status))) {
      if (!progress->Flush(absl::Seconds(2))) progress->Abandon();
      return status;
    }
    // In place: report where this rank stands and wait for the next attempt.
    event(absl::StrCat("attempt ", plan.attempt, " stopped (", reason,
                       "); holding its snapshots for the next attempt"));
    loom::v1::RankProgress stopped = PhaseReport("aborted", last_step);
    SetHoldings(keeper->Holdings(), stopped.mutable_snapshots());
    progress->Report(std::move(stopped));
    if (!progress->Flush(absl::Seconds(2))) progress->Abandon();
    progress.reset();
    absl::StatusOr<ControlMailbox::NextAttempt> next =
        world.control->WaitForNext(plan.attempt, timeout);
    if (!next.ok()) {
      return absl::DeadlineExceededError(absl::StrCat(next.status().message(), " (", reason, ")"));
    }
    if (next->spill.has_value()) {
      return Spill(*next->spill, first, job, plan, timeout, world, *keeper);
    }
    absl::StatusOr<AttemptPlan> next_plan = NextPlan(*next->epoch, first.rank());
    if (!next_plan.ok()) return absl::InternalError(next_plan.status().message());
    event(absl::StrCat("entering attempt ", next_plan->attempt, ": rolling back to step ",
                       next_plan->restore.step()));
    plan = *std::move(next_plan);
  }
}

}  // namespace loom::trainer
