// Placement without the job mutex. One scheduler thread owns placement and
// the sending of every message to the agents: it copies what it needs under
// mu_ (the first waiting job and the devices other jobs hold), computes the
// placement and every rank's assignment without the lock, commits under mu_
// only if nothing it read has changed, and sends after unlocking. A large
// job's placement therefore never stalls other RPCs, heartbeats included.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "coordinator/jobs/assignment_builder.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/jobs/job_states.h"
#include "coordinator/jobs/rank_peak.h"
#include "common/confine/path_rules.h"
#include "common/topology/placement.h"
#include "coordinator/jobs/layout_proto.h"

namespace loom::coordinator {

using loom::v1::Job;
using loom::v1::JobState;

struct JobManager::PlacementSnapshot {
  std::string job_id;
  JobState state = JobState::PENDING;
  int32_t attempt = 0;  // before this placement
  spec::JobSpec spec;
  std::string resolved_spec_yaml;
  std::string owner;
  std::string checkpoint_dir;  // Job.checkpoint_dir: <checkpoint_root>/<owner>/<id>
  std::set<std::string> avoid;                         // nodes that failed this job
  std::map<std::string, std::set<int32_t>> taken;      // devices other jobs hold, by node
};

struct JobManager::PlacementResult {
  bool fits = false;
  absl::Status error;  // the job can never be placed as specified: it fails
  std::string store_namespace;
  std::vector<loom::v1::RankAssignment> assignments;
  std::shared_ptr<const Placement> placement;  // built here, without the lock
  double peak_flops = 0;  // summed over the placement (for MFU)
  std::set<std::string> nodes;
  std::string nodes_text;
};

void JobManager::Schedule() {
  absl::MutexLock lock(&mu_);
  ScheduleLocked();
}

void JobManager::ScheduleLocked() {
  schedule_requested_ = true;
  ++requests_queued_;
}

void JobManager::WaitForScheduler() {
  absl::MutexLock lock(&mu_);
  ScheduleLocked();
  const int64_t target = requests_queued_;
  auto done = [this, target]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return requests_handled_ >= target || stopping_;
  };
  mu_.Await(absl::Condition(&done));
}

void JobManager::QueueSendLocked(const std::string& node_id, loom::v1::CoordinatorMessage message) {
  outbox_.emplace_back(node_id, std::move(message));
}

void JobManager::FlushOutbox() {
  // Only the scheduler thread sends, so messages leave in the order they were
  // queued (a kill never overtakes the launch it is meant to stop).
  while (true) {
    std::deque<std::pair<std::string, loom::v1::CoordinatorMessage>> batch;
    {
      absl::MutexLock lock(&mu_);
      batch.swap(outbox_);
    }
    if (batch.empty()) return;
    for (auto& [node, message] : batch) nodes_->Send(node, message);
  }
}

void JobManager::SchedulerLoop() {
  while (true) {
    bool place = false;
    int64_t handled = 0;
    {
      absl::MutexLock lock(&mu_);
      auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return schedule_requested_ || !outbox_.empty() || stopping_;
      };
      mu_.Await(absl::Condition(&has_work));
      if (stopping_) return;
      place = schedule_requested_;
      schedule_requested_ = false;
      handled = requests_queued_;
    }
    FlushOutbox();
    if (place) RunSchedulingPass();
    FlushOutbox();
    absl::MutexLock lock(&mu_);
    requests_handled_ = std::max(requests_handled_, handled);
  }
}

void JobManager::RunSchedulingPass() {
  // First come, first served: a job that does not fit blocks the ones behind
  // it, so a large job is not starved by a stream of small ones.
  while (true) {
    // Devices of every node known, live or not, by kind: what the cluster
    // could hold if it were free.
    const std::map<std::string, int64_t> capacity = nodes_->Counts().all_devices;
    PlacementSnapshot snapshot;
    {
      absl::MutexLock lock(&mu_);
      if (!SnapshotNextLocked(capacity, snapshot)) return;
    }
    PlacementResult result = Place(snapshot);
    if (!result.fits && result.error.ok()) return;  // waits for devices
    {
      absl::MutexLock lock(&mu_);
      // When the job or a node changed meanwhile nothing is recorded and the
      // next round starts from a fresh snapshot.
      CommitLocked(snapshot, result);
    }
    FlushOutbox();
  }
}

bool JobManager::SnapshotNextLocked(const std::map<std::string, int64_t>& capacity,
                                    PlacementSnapshot& snapshot) {
  const JobRecord* next = nullptr;
  for (const std::string& id : order_) {
    const JobRecord& record = jobs_.at(id);
    // A job larger than every node known together waits without holding up
    // the queue: it could not start before more nodes join anyway.
    auto devices = capacity.find(spec::DeviceKindName(record.spec.resources.device));
    if (record.spec.resources.world_size() >
        (devices == capacity.end() ? 0 : devices->second)) {
      continue;
    }
    const JobState state = record.job.state();
    const bool restart_ready =
        state == JobState::RESTARTING &&
        absl::ToUnixMillis(absl::Now()) >= record.job.not_before_unix_ms() &&
        record.ranks_exited == record.ranks.size();
    if (state == JobState::PENDING || restart_ready) {
      next = &record;
      break;
    }
  }
  if (next == nullptr) return false;
  snapshot.job_id = next->job.id();
  snapshot.state = next->job.state();
  snapshot.attempt = next->job.attempt();
  snapshot.spec = next->spec;
  snapshot.resolved_spec_yaml = next->job.resolved_spec_yaml();
  snapshot.owner = next->job.owner();
  snapshot.checkpoint_dir = next->job.checkpoint_dir();
  for (const auto& [node, failures] : next->node_failures) snapshot.avoid.insert(node);
  for (const auto& [id, other] : jobs_) {
    if (!HoldsDevices(other.job.state()) || &other == next) continue;
    for (const auto& p : *other.placement) {
      snapshot.taken[p.node_id()].insert(p.local_device());
    }
  }
  return true;
}

JobManager::PlacementResult JobManager::Place(const PlacementSnapshot& snapshot) const {
  PlacementResult result;
  const spec::JobSpec& spec = snapshot.spec;
  const std::string kind = spec::DeviceKindName(spec.resources.device);
  topology::PlacementRequest request;
  request.shape = spec::LayoutOf(spec);
  request.avoid = snapshot.avoid;
  std::map<std::string, NodeInfo> live;
  for (const NodeInfo& node : nodes_->LiveNodes()) {
    if (node.device_kind != kind) continue;
    // A cordoned node is used only when nothing else can hold the job, so a
    // small cluster still runs (and a job that fails everywhere still reaches
    // its budget) while healthy nodes are preferred.
    if (node.cordoned) request.avoid.insert(node.node_id);
    auto taken = snapshot.taken.find(node.node_id);
    topology::NodeDevices devices{.node_id = node.node_id, .free_devices = 0, .device_ids = {}};
    for (int32_t d = 0; d < node.device_count; ++d) {
      if (taken == snapshot.taken.end() || taken->second.count(d) == 0) {
        devices.device_ids.push_back(d);
      }
    }
    devices.free_devices = static_cast<int64_t>(devices.device_ids.size());
    if (devices.free_devices == 0) continue;
    request.nodes.push_back(devices);
    live[node.node_id] = node;
  }
  absl::StatusOr<topology::Placement> placement = topology::PlaceRanks(request);
  if (!placement.ok()) return result;  // waits for devices

  const int32_t attempt = snapshot.attempt + 1;
  AttemptContext context;
  context.job_id = snapshot.job_id;
  context.attempt = attempt;
  context.resolved_spec_yaml = snapshot.resolved_spec_yaml;
  context.checkpoint_dir = snapshot.checkpoint_dir;
  context.data_dir = options_.roots.data_roots.front();
  context.owner = snapshot.owner;
  if (!spec.checkpoint.resume_from.empty()) {
    absl::StatusOr<std::string> from = confine::JobCheckpointDir(
        options_.roots.checkpoint_root, snapshot.owner, spec.checkpoint.resume_from);
    if (from.ok()) {
      context.resume_from_job = spec.checkpoint.resume_from;
      context.resume_from_dir = *from;
    }
  }
  context.collective_timeout_s = options_.collective_timeout_s;
  context.store_namespace = NewStoreNamespace(snapshot.job_id, attempt);
  std::map<std::string, std::string> addresses;
  for (const auto& [id, node] : live) addresses[id] = node.address;
  absl::StatusOr<std::vector<loom::v1::RankAssignment>> assignments =
      BuildAssignments(spec, *placement, context, addresses);
  if (!assignments.ok()) {
    result.error = absl::InvalidArgumentError(
        absl::StrCat("cannot build rank assignments: ", assignments.status().message()));
    return result;
  }
  if (options_.rank_token_issuer) {
    for (auto& a : *assignments) a.set_rank_token(options_.rank_token_issuer(a));
  }
  // A launch above the transport's limit would break the node's session at
  // every attempt (and the node would look at fault): the job is what is too
  // large, so the job fails, before anything is sent.
  for (const auto& a : *assignments) {
    loom::v1::CoordinatorMessage message;
    *message.mutable_launch()->mutable_assignment() = a;
    const int64_t bytes = static_cast<int64_t>(message.ByteSizeLong());
    if (bytes > options_.max_launch_bytes) {
      result.error = absl::ResourceExhaustedError(absl::StrCat(
          "the launch message of rank ", a.rank(), " would be ", bytes,
          " bytes, above the transport limit of ", options_.max_launch_bytes,
          " bytes (a smaller model.num_layers or fewer ranks make it smaller)"));
      return result;
    }
  }
  result.fits = true;
  result.store_namespace = context.store_namespace;
  auto places = std::make_shared<Placement>();
  places->Reserve(static_cast<int>(assignments->size()));
  for (const auto& a : *assignments) {
    result.nodes.insert(a.node_id());
    loom::v1::RankPlacement* p = places->Add();
    p->set_rank(a.rank());
    p->set_node_id(a.node_id());
    p->set_local_device(a.local_device());
    p->set_place(a.place());
    p->set_peak_flops(RankPeakFlops(live[a.node_id()], spec.train.precision));
    result.peak_flops += p->peak_flops();
  }
  result.placement = std::move(places);
  for (const auto& use : placement->nodes) {
    absl::StrAppend(&result.nodes_text, result.nodes_text.empty() ? "" : ", ", use.node_id,
                    " (ranks ", use.first_rank, "-", use.first_rank + use.num_ranks - 1, ")");
  }
  result.assignments = *std::move(assignments);
  return result;
}

bool JobManager::CommitLocked(const PlacementSnapshot& snapshot, PlacementResult& result) {
  auto it = jobs_.find(snapshot.job_id);
  if (it == jobs_.end()) return false;
  JobRecord& record = it->second;
  Job& job = record.job;
  if (job.state() != snapshot.state || job.attempt() != snapshot.attempt) return false;
  if (!result.error.ok()) {
    // Nothing was sent and no node is blamed: the spec is what cannot run.
    TransitionLocked(record, JobState::FAILED, std::string(result.error.message()));
    FinishAttemptLocked(record);
    return true;
  }
  for (const std::string& node : result.nodes) {
    std::optional<NodeInfo> info = nodes_->Get(node);
    if (!info || !info->live) return false;
  }

  const int32_t attempt = snapshot.attempt + 1;
  job.set_attempt(attempt);
  record.ranks.assign(result.assignments.size(), RankState{});
  record.ranks_ready = 0;
  record.ranks_resumed = 0;
  record.ranks_exited = 0;
  record.placement = std::move(result.placement);
  record.peak_flops = result.peak_flops;
  job.set_store_namespace(result.store_namespace);
  kv_->OpenNamespace(result.store_namespace);
  record.placed_at = absl::Now();
  std::vector<std::string> places;
  places.reserve(record.placement->size());
  for (const auto& p : *record.placement) places.push_back(p.place());
  HangPolicy policy = options_.hang_policy;
  policy.fixed_timeout = absl::Seconds(record.spec.fault_tolerance.hang_timeout_s);
  record.hang = std::make_unique<HangDetector>(policy, std::move(places), absl::Now());
  // A recovery's placement phase ends.
  IncidentCompletedLocked(record, MarkPlaced(job, absl::Now()));
  TransitionLocked(record, JobState::STARTING,
                   absl::StrCat("attempt ", attempt, " placed on ", result.nodes_text));
  for (auto& a : result.assignments) {
    loom::v1::CoordinatorMessage message;
    const std::string node = a.node_id();
    *message.mutable_launch()->mutable_assignment() = std::move(a);
    QueueSendLocked(node, std::move(message));
  }
  return true;
}

}  // namespace loom::coordinator
