#include "coordinator/jobs/job_scheduler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/confine/path_rules.h"
#include "common/topology/placement.h"
#include "common/topology/snapshot_ring.h"
#include "coordinator/jobs/assignment_builder.h"
#include "coordinator/jobs/in_place_messages.h"
#include "coordinator/jobs/job_states.h"
#include "coordinator/jobs/rank_peak.h"

namespace loom::coordinator {

using loom::v1::Job;
using loom::v1::JobState;

JobScheduler::JobScheduler(SchedulerOptions options, JobTable* table, JobLifecycle* lifecycle,
                           NodeRegistry* nodes)
    : options_(std::move(options)), table_(table), lifecycle_(lifecycle), nodes_(nodes) {}

JobScheduler::~JobScheduler() { Stop(); }

void JobScheduler::Start() { thread_ = std::thread([this] { Loop(); }); }

void JobScheduler::Stop() {
  {
    absl::MutexLock lock(&table_->mu());
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void JobScheduler::Schedule() {
  absl::MutexLock lock(&table_->mu());
  table_->RequestScheduleLocked();
}

void JobScheduler::WaitHandled() {
  absl::MutexLock lock(&table_->mu());
  const int64_t target = table_->RequestScheduleLocked();
  auto done = [this, target]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu()) {
    return handled_ >= target || stopping_;
  };
  table_->mu().Await(absl::Condition(&done));
}

void JobScheduler::Flush() {
  // Only this thread sends, so messages leave in the order they were queued
  // (a kill never overtakes the launch it is meant to stop).
  while (true) {
    std::deque<std::pair<std::string, loom::v1::CoordinatorMessage>> batch;
    {
      absl::MutexLock lock(&table_->mu());
      batch = table_->TakeOutboxLocked();
    }
    if (batch.empty()) return;
    for (auto& [node, message] : batch) nodes_->Send(node, message);
  }
}

void JobScheduler::Loop() {
  while (true) {
    int64_t request = 0;
    {
      absl::MutexLock lock(&table_->mu());
      auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu()) {
        return table_->ScheduleRequestedLocked() || !table_->OutboxEmptyLocked() || stopping_;
      };
      table_->mu().Await(absl::Condition(&has_work));
      if (stopping_) break;
      request = table_->TakeScheduleRequestLocked();
    }
    Flush();
    if (request != 0) RunPass();
    Flush();
    absl::MutexLock lock(&table_->mu());
    handled_ = std::max(handled_, request);
  }
  Flush();  // what was decided before the stop still reaches the agents
}

void JobScheduler::RunPass() {
  // First come, first served: a job that does not fit blocks the ones behind
  // it, so a large job is not starved by a stream of small ones.
  while (true) {
    // Devices of every node known, live or not, by kind: what the cluster
    // could hold if it were free.
    const std::map<std::string, int64_t> capacity = nodes_->Counts().all_devices;
    Snapshot snapshot;
    {
      absl::MutexLock lock(&table_->mu());
      if (!table_->ActingLocked()) return;
      // An in-place recovery holds its devices already: it never waits in line.
      if (!SnapshotRelaunchLocked(snapshot) && !SnapshotNextLocked(capacity, snapshot)) return;
    }
    Result result = snapshot.relaunch ? PlaceInPlace(snapshot) : Place(snapshot);
    if (!snapshot.relaunch && !result.fits && result.error.ok()) {  // waits for devices
      if (!result.waits_because.empty()) {
        absl::MutexLock lock(&table_->mu());
        lifecycle_->NoteWaitingLocked(snapshot.job_id, snapshot.attempt, result.waits_because);
      }
      return;
    }
    {
      absl::MutexLock lock(&table_->mu());
      // When the job or a node changed meanwhile nothing is recorded and the
      // next round starts from a fresh snapshot.
      if (table_->ActingLocked()) CommitLocked(snapshot, result);
    }
    Flush();
  }
}

bool JobScheduler::SnapshotNextLocked(const std::map<std::string, int64_t>& capacity,
                                      Snapshot& snapshot) {
  const JobRecord* next = nullptr;
  const int64_t now_ms = absl::ToUnixMillis(absl::Now());
  for (const std::string& id : table_->OrderLocked()) {
    const JobRecord& record = table_->AtLocked(id);
    // A job larger than every node known together waits without holding up
    // the queue: it could not start before more nodes join anyway.
    auto devices = capacity.find(spec::DeviceKindName(record.spec.resources.device));
    if (record.spec.resources.world_size() >
        (devices == capacity.end() ? 0 : devices->second)) {
      continue;
    }
    const JobState state = record.job.state();
    const bool restart_ready = state == JobState::RESTARTING &&
                               now_ms >= record.job.not_before_unix_ms() &&
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
  snapshot.spec_yaml = next->job.spec_yaml();
  snapshot.owner = next->job.owner();
  snapshot.checkpoint_dir = next->job.checkpoint_dir();
  for (const auto& [node, failures] : next->node_failures) snapshot.avoid.insert(node);
  for (const std::string& id : table_->OrderLocked()) {
    const JobRecord& other = table_->AtLocked(id);
    if (!HoldsDevices(other.job.state()) || &other == next) continue;
    for (const auto& p : *other.placement) snapshot.taken[p.node_id()].insert(p.local_device());
    for (const auto& p : other.job.spare_devices()) {  // a job's own spares are its alone
      snapshot.taken[p.node_id()].insert(p.local_device());
    }
  }
  return true;
}

JobScheduler::Result JobScheduler::Place(const Snapshot& snapshot) const {
  Result result;
  const spec::JobSpec& spec = snapshot.spec;
  const std::string kind = spec::DeviceKindName(spec.resources.device);
  topology::PlacementRequest request;
  request.shape = spec::LayoutOf(spec);
  request.avoid = snapshot.avoid;
  for (const NodeInfo& node : nodes_->LiveNodes()) {
    // A node whose session ended takes nothing new until it is back.
    if (node.device_kind != kind || !node.connected) continue;
    // A cordoned node is used only when nothing else can hold the job, so a
    // small cluster still runs (and a job that fails everywhere still reaches
    // its budget) while healthy nodes are preferred.
    if (node.cordoned) request.avoid.insert(node.node_id);
    // A cluster spare holds no job's first attempt; a job placed again after
    // a failure uses it only when nothing else can hold it (relaunches in
    // place prefer it: relaunch_placement.h).
    if (node.spare && snapshot.attempt == 0) continue;
    if (node.spare) request.avoid.insert(node.node_id);
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
  }
  if (std::optional<Result> resized = PlaceElastic(snapshot, request)) return *std::move(resized);
  absl::StatusOr<topology::Placement> placement = topology::PlaceRanks(request);
  if (!placement.ok()) return result;  // waits for devices
  BuildAttempt(snapshot, *placement, nullptr, result);
  if (result.fits) ReserveSpares(spec, request, *placement, result);
  return result;
}

void JobScheduler::BuildAttempt(const Snapshot& snapshot, const topology::Placement& placement,
                                const InPlaceDecision* in_place, Result& result) const {
  const spec::JobSpec& spec = snapshot.spec;
  std::map<std::string, NodeInfo> live;
  for (const NodeInfo& node : nodes_->LiveNodes()) live[node.node_id] = node;
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
  if (absl::Status s = CheckLaunchSizeLowerBound(spec, options_.max_launch_bytes); !s.ok()) {
    result.error = s;
    return;
  }
  absl::StatusOr<std::vector<loom::v1::RankAssignment>> assignments =
      BuildAssignments(spec, placement, context, addresses);
  if (!assignments.ok()) {
    result.error = absl::InvalidArgumentError(
        absl::StrCat("cannot build rank assignments: ", assignments.status().message()));
    return;
  }
  if (options_.rank_token_issuer) {
    for (auto& a : *assignments) a.set_rank_token(options_.rank_token_issuer(a));
  }
  // Every placement has its snapshot ring; in place, the rings and restore
  // plans of the decision, and the survivors' EnterEpoch by node.
  if (in_place != nullptr) {
    ApplyInPlace(*in_place, *assignments);
    result.attempt.epochs = EnterEpochsByNode(*in_place, *assignments, snapshot.attempt);
  } else {
    SetSnapshotRings(topology::BuildSnapshotRing(placement.slots), *assignments);
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
      return;
    }
  }
  result.fits = true;
  result.attempt.store_namespace = context.store_namespace;
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
    result.attempt.peak_flops += p->peak_flops();
  }
  result.attempt.placement = std::move(places);
  for (const auto& use : placement.nodes) {
    absl::StrAppend(&result.attempt.nodes_text, result.attempt.nodes_text.empty() ? "" : ", ",
                    use.node_id, " (ranks ", use.first_rank, "-",
                    use.first_rank + use.num_ranks - 1, ")");
  }
  result.attempt.assignments = *std::move(assignments);
}

bool JobScheduler::CommitLocked(const Snapshot& snapshot, Result& result) {
  if (snapshot.relaunch) return CommitInPlaceLocked(snapshot, result);
  JobRecord* record = table_->FindLocked(snapshot.job_id);
  if (record == nullptr) return false;
  if (record->job.state() != snapshot.state || record->job.attempt() != snapshot.attempt) {
    return false;
  }
  if (!result.error.ok()) {
    lifecycle_->FailUnplaceableLocked(*record, std::string(result.error.message()));
    return true;
  }
  for (const std::string& node : result.nodes) {
    std::optional<NodeInfo> info = nodes_->Get(node);
    if (!info || !info->live || !info->connected) return false;
  }
  if (result.resize) lifecycle_->ResizeLocked(*record, *result.resize);
  lifecycle_->StartAttemptLocked(*record, std::move(result.attempt));
  return true;
}

}  // namespace loom::coordinator
