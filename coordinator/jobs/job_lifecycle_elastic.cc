// The lifecycle's part of elastic jobs (job_lifecycle.h;
// docs/fault_tolerance.md, "Elastic jobs"): a resize the scheduler placed is
// recorded (the job's spec, layout and history), a job that waits says why,
// and a job running below its requested size grows back when devices are
// free, no sooner than fault_tolerance.min_resize_interval_s after its last
// resize. The sizes are elastic_policy.h's.
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/spec/job_spec_yaml.h"
#include "common/spec/layout.h"
#include "coordinator/jobs/job_lifecycle.h"
#include "coordinator/jobs/job_states.h"
#include "coordinator/jobs/layout_proto.h"

namespace loom::coordinator {

using loom::v1::Job;
using loom::v1::JobState;

void JobLifecycle::ResizeLocked(JobRecord& record, const ElasticDecision& resize) {
  record.spec = resize.spec;
  record.job.set_resolved_spec_yaml(spec::ToYaml(resize.spec));
  *record.job.mutable_layout() = LayoutToProto(spec::LayoutOf(resize.spec));
  table_->RecordEventLocked(record, resize.reason);
}

void JobLifecycle::NoteWaitingLocked(const std::string& job_id, int32_t attempt,
                                     const std::string& why) {
  JobRecord* record = table_->FindLocked(job_id);
  if (record == nullptr || record->job.attempt() != attempt ||
      record->job.state() != JobState::RESTARTING) {
    return;
  }
  const auto& history = record->job.history();
  if (!history.empty() && history.rbegin()->message() == why) return;
  table_->RecordEventLocked(*record, why);
}

void JobLifecycle::HoldSpares(Job& job, const std::vector<loom::v1::RankPlacement>& spares) {
  job.clear_spare_devices();
  for (const auto& s : spares) *job.add_spare_devices() = s;
}

void JobLifecycle::DropUsedSpares(Job& job, const Placement& placement) {
  std::set<std::pair<std::string, int64_t>> used;
  for (const auto& p : placement) used.insert({p.node_id(), p.local_device()});
  google::protobuf::RepeatedPtrField<loom::v1::RankPlacement> kept;
  for (const auto& s : job.spare_devices()) {
    if (used.count({s.node_id(), s.local_device()}) == 0) *kept.Add() = s;
  }
  job.mutable_spare_devices()->Swap(&kept);
}

int64_t JobLifecycle::RequestedRanks(const JobRecord& record) {
  if (record.job.spec_yaml().empty()) return record.spec.resources.world_size();
  absl::StatusOr<spec::JobSpec> submitted =
      spec::ParseJobSpecYaml(record.job.spec_yaml(), "the submitted spec");
  return submitted.ok() ? submitted->resources.world_size() : record.spec.resources.world_size();
}

bool JobLifecycle::CheckGrowLocked(JobRecord& record, absl::Time now) {
  const spec::JobSpec& current = record.spec;
  Job& job = record.job;
  // Growing back resumes from the step the job saves as it stops: without
  // checkpoints it would start over, so it keeps its reduced size.
  if (job.state() != JobState::RUNNING || job.has_stop() ||
      current.fault_tolerance.min_ranks <= 0 || current.checkpoint.dir.empty()) {
    return false;
  }
  const absl::Time last = LastResize(job);
  if (last == absl::InfinitePast() ||
      now - last < absl::Seconds(current.fault_tolerance.min_resize_interval_s)) {
    return false;  // never resized, or too soon (checked first: no parse, no planning)
  }
  absl::StatusOr<spec::JobSpec> requested = RequestedSpec(job.spec_yaml(), current);
  if (!requested.ok() ||
      requested->resources.world_size() <= current.resources.world_size()) {
    return false;
  }
  // Devices the job could hold: its own and those no other job holds, on
  // live nodes that are neither cordoned nor cluster spares (spares are for
  // failures).
  std::set<std::string> excluded;
  for (const NodeInfo& node : nodes_->LiveNodes()) {
    if (node.spare || node.cordoned) excluded.insert(node.node_id);
  }
  int64_t available = 0;
  for (const RelaunchNode& node : RelaunchNodesLocked(record)) {
    if (excluded.count(node.node_id) == 0) available += static_cast<int64_t>(node.free_devices.size());
  }
  const ElasticDecision grow = DecideGrow(*requested, current, available, now, last);
  if (grow.action != ElasticAction::kResize) return false;
  // At a step boundary: the ranks save their next step (a graceful stop),
  // and the job, PREEMPTED, is placed again at the larger size from it
  // (job_scheduler_elastic.cc).
  if (!StopGracefullyLocked(record, absl::StrCat(kStopsToGrowBack, grow.ranks, " ranks (",
                                                 available - current.resources.world_size(),
                                                 " more devices free)"))) {
    return false;
  }
  job.mutable_stop()->set_resize(true);
  return true;
}

}  // namespace loom::coordinator
