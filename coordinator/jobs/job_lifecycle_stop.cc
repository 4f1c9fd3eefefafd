// Graceful stops (job_lifecycle.h; docs/scheduling.md, "Preemption"): a job
// told to stop (preempted, its node drained) has its ranks finish the step
// they are in, agree to stop after it, save it and exit with kExitStopped;
// ranks signalled from outside (SIGUSR1) stop the same way on their own.
// Once every rank of the attempt is gone the job is PREEMPTED: it waits in
// the queue and resumes from that step. Not a failure: no restart is
// counted. A rank that fails while the job stops, a lost node or a hang ends
// the stop early (the rest are killed) and the job resumes from its newest
// checkpoint; so does a job whose ranks have not stopped by the deadline.
#include <limits>
#include <optional>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/exit_codes.h"
#include "coordinator/jobs/job_lifecycle.h"
#include "coordinator/jobs/job_states.h"

namespace loom::coordinator {

using loom::v1::Job;
using loom::v1::JobState;

bool JobLifecycle::StopGracefullyLocked(JobRecord& record, const std::string& reason) {
  Job& job = record.job;
  if (job.has_stop()) return false;  // told already
  const JobState state = job.state();
  if (state != JobState::RUNNING && state != JobState::STARTING) return false;
  const absl::Time now = absl::Now();
  loom::v1::GracefulStop& stop = *job.mutable_stop();
  stop.set_reason(reason);
  stop.set_attempt(job.attempt());
  stop.set_requested_unix_ms(absl::ToUnixMillis(now));
  stop.set_deadline_unix_ms(absl::ToUnixMillis(now + options_.stop_grace));
  table_->RecordEventLocked(
      record, absl::StrCat(reason, ": stopping gracefully; the ranks save their next step and "
                                   "the job resumes from it"));
  std::set<std::string> nodes;
  for (const auto& p : *record.placement) nodes.insert(p.node_id());
  // Any one rank told would do (the ranks vote every step), but every node
  // is told so that one unreachable node does not hold the stop up.
  for (const std::string& node : nodes) {
    table_->SendAfterStoredLocked(record, node, StopMessage(job));
  }
  return true;
}

loom::v1::CoordinatorMessage JobLifecycle::StopMessage(const Job& job) {
  loom::v1::CoordinatorMessage message;
  message.mutable_stop()->set_job_id(job.id());
  message.mutable_stop()->set_attempt(job.stop().attempt());
  message.mutable_stop()->set_reason(job.stop().reason());
  return message;
}

void JobLifecycle::ResendStopsLocked(const std::string& node_id) {
  for (const std::string& id : table_->OrderLocked()) {
    JobRecord& record = table_->AtLocked(id);
    if (!record.job.has_stop() || !HoldsDevices(record.job.state())) continue;
    for (const auto& p : *record.placement) {
      if (p.node_id() != node_id) continue;
      table_->SendAfterStoredLocked(record, node_id, StopMessage(record.job));
      break;
    }
  }
}

void JobLifecycle::StopIfOnDrainedNodeLocked(JobRecord& record) {
  std::set<std::string> nodes;
  for (const auto& p : *record.placement) nodes.insert(p.node_id());
  for (const std::string& node : nodes) {
    std::optional<NodeInfo> info = nodes_->Get(node);
    if (info && info->draining) {
      StopGracefullyLocked(record,
                           absl::StrCat("node ", node, " drained: ", info->cordon_reason));
      return;
    }
  }
}

int JobLifecycle::DrainNodeLocked(const std::string& node_id, const std::string& reason) {
  int stopping = 0;
  for (const std::string& id : table_->OrderLocked()) {
    JobRecord& record = table_->AtLocked(id);
    if (!HoldsDevices(record.job.state())) continue;
    bool here = false;
    for (const auto& p : *record.placement) here |= p.node_id() == node_id;
    if (!here) continue;
    if (StopGracefullyLocked(record, absl::StrCat("node ", node_id, " drained: ", reason))) {
      ++stopping;
    }
  }
  return stopping;
}

bool JobLifecycle::StoppedExitLocked(JobRecord& record, const std::string& node_id,
                                     const loom::v1::RankExited& exit) {
  Job& job = record.job;
  const bool stopped = exit.signal() == 0 && exit.exit_code() == kExitStopped;
  const bool ok = exit.signal() == 0 && exit.exit_code() == kExitOk;
  if (!stopped && (ok || !job.has_stop())) return false;  // not this file's
  if (!MarkExitedLocked(record, exit.rank(), false)) return true;
  record.ranks[exit.rank()].stopped = stopped;
  if (!job.has_stop()) {
    // Stopped on its own (SIGUSR1 from a batch system): the whole job agreed.
    loom::v1::GracefulStop& stop = *job.mutable_stop();
    stop.set_reason(absl::StrCat("rank ", exit.rank(), " on node ", node_id,
                                 " was asked to stop (a signal from outside)"));
    stop.set_attempt(job.attempt());
    stop.set_requested_unix_ms(absl::ToUnixMillis(absl::Now()));
    stop.set_deadline_unix_ms(absl::ToUnixMillis(absl::Now() + options_.stop_grace));
  } else if (!stopped) {
    // A rank that failed while the job stopped: its peers wait for it in a
    // collective, so they are stopped now; the job resumes from its newest
    // checkpoint.
    EndStopEarlyLocked(
        record, absl::StrCat("rank ", exit.rank(), " on node ", node_id, " exited with ",
                             exit.signal() != 0 ? absl::StrCat("signal ", exit.signal())
                                                : absl::StrCat("code ", exit.exit_code()),
                             " while the job stopped; the others are killed and it resumes "
                             "from its newest checkpoint"));
  }
  FinishStopIfDoneLocked(record);
  return true;
}

bool JobLifecycle::StopInsteadOfRecoveringLocked(JobRecord& record, const Failure& failure) {
  if (!record.job.has_stop()) return false;
  EndStopEarlyLocked(record, absl::StrCat(failure.reason,
                                          " while the job stopped; the others are killed and it "
                                          "resumes from its newest checkpoint"));
  FinishStopIfDoneLocked(record);
  return true;
}

void JobLifecycle::FinishStopIfDoneLocked(JobRecord& record) {
  if (record.ranks_exited != record.ranks.size()) return;
  Job& job = record.job;
  size_t stopped = 0;
  for (const RankState& r : record.ranks) stopped += r.stopped ? 1 : 0;
  const int64_t step = job.last_progress().step();
  std::string message;
  if (stopped == record.ranks.size()) {
    message = absl::StrCat("stopped after step ", step, " with a checkpoint of it (",
                           job.stop().reason(), "); waits to resume from step ", step);
  } else {
    message = absl::StrCat("stopped (", job.stop().reason(), "), ", stopped, " of ",
                           record.ranks.size(), " ranks after saving; waits to resume from its "
                           "newest checkpoint");
  }
  if (!job.stop().resize()) job.set_preemptions(job.preemptions() + 1);
  job.clear_stop();
  TransitionLocked(record, JobState::PREEMPTED, message);
  FinishAttemptLocked(record);
  table_->RequestScheduleLocked();
}

void JobLifecycle::CheckStopDeadlineLocked(JobRecord& record, absl::Time now) {
  Job& job = record.job;
  if (!job.has_stop() || absl::ToUnixMillis(now) < job.stop().deadline_unix_ms()) return;
  EndStopEarlyLocked(record, absl::StrCat("the ranks did not stop within ",
                                          absl::FormatDuration(options_.stop_grace),
                                          "; killed: the job resumes from its newest checkpoint"));
}

void JobLifecycle::EndStopEarlyLocked(JobRecord& record, const std::string& why) {
  loom::v1::GracefulStop& stop = *record.job.mutable_stop();
  constexpr int64_t kEnded = std::numeric_limits<int64_t>::max();
  if (stop.deadline_unix_ms() == kEnded) return;  // once: the kills' exits finish the stop
  stop.set_deadline_unix_ms(kEnded);
  table_->RecordEventLocked(record, why);
  KillRanksLocked(record);
}

}  // namespace loom::coordinator
