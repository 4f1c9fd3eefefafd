#include "coordinator/jobs/job_scheduler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/confine/path_rules.h"
#include "common/topology/node_labels.h"
#include "common/topology/placement.h"
#include "common/topology/snapshot_ring.h"
#include "coordinator/jobs/assignment_builder.h"
#include "coordinator/jobs/in_place_messages.h"
#include "coordinator/jobs/job_states.h"
#include "coordinator/jobs/rank_peak.h"
#include "planner/job_planner.h"

namespace loom::coordinator {

using loom::v1::Job;
using loom::v1::JobState;

JobScheduler::JobScheduler(SchedulerOptions options, JobTable* table, JobLifecycle* lifecycle,
                           NodeRegistry* nodes)
    : options_(std::move(options)),
      table_(table),
      lifecycle_(lifecycle),
      nodes_(nodes),
      usage_(options_.fair_share_half_life_s) {
  if (options_.metrics != nullptr) {
    metrics_ = std::make_unique<SchedulerMetrics>(options_.metrics->registry());
  }
}

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
  // Jobs the policy let start but no nodes could hold (a TP group stays inside
  // a node): the policy sees them as not fitting for the rest of this pass.
  std::set<std::string> unplaceable;
  while (true) {
    const Devices devices = ReadDevices();
    Snapshot snapshot;
    {
      absl::MutexLock lock(&table_->mu());
      if (!table_->ActingLocked()) return;
      // An in-place recovery holds its devices already: it never waits in line.
      if (!SnapshotRelaunchLocked(snapshot) &&
          !SnapshotNextLocked(devices, unplaceable, snapshot)) {
        return;
      }
    }
    Result result = snapshot.relaunch ? PlaceInPlace(snapshot) : Place(snapshot);
    if (!snapshot.relaunch && !result.fits && result.error.ok()) {  // waits for devices
      if (!result.waits_because.empty()) {
        absl::MutexLock lock(&table_->mu());
        lifecycle_->NoteWaitingLocked(snapshot.job_id, snapshot.attempt, result.waits_because);
      }
      unplaceable.insert(snapshot.job_id);
      continue;
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

JobScheduler::Devices JobScheduler::ReadDevices() const {
  Devices devices;
  devices.capacity = nodes_->Counts().all_devices;
  for (const NodeInfo& node : nodes_->LiveNodes()) {
    if (!node.connected || node.draining) continue;
    devices.nodes[node.node_id] = {node.device_kind, node.device_count};
  }
  return devices;
}

void JobScheduler::ChargeUsageLocked(absl::Time now) {
  const double elapsed =
      charged_at_ == absl::InfinitePast() ? 0 : absl::ToDoubleSeconds(now - charged_at_);
  charged_at_ = now;
  if (elapsed <= 0) return;
  const double now_s = absl::ToDoubleSeconds(now - absl::UnixEpoch());
  for (const std::string& id : table_->OrderLocked()) {
    const JobRecord& record = table_->AtLocked(id);
    if (!HoldsDevices(record.job.state())) continue;
    usage_.Charge(record.job.owner(),
                  elapsed * static_cast<double>(record.placement->size()), now_s);
  }
}

namespace {

// The planner's prediction of the steps the job has left, in seconds (taken
// once per job); 0 when it has none.
double PredictedSecondsLeft(JobRecord& record) {
  if (record.predicted_step_s < 0) {
    absl::StatusOr<double> step = planner::PredictStepSeconds(record.spec);
    record.predicted_step_s = step.ok() ? *step : 0;
  }
  const int64_t left = record.spec.train.steps - record.job.last_progress().step();
  return left > 0 ? record.predicted_step_s * static_cast<double>(left) : 0;
}

// When a running job is expected to end, for backfill: its promise, the
// trainer's own estimate of the time left, or the planner's; 0: not known.
double RuntimeOf(JobRecord& record, double started_s, double now_s) {
  if (record.spec.scheduling.max_runtime_s > 0) return record.spec.scheduling.max_runtime_s;
  const double elapsed = std::max(now_s - started_s, 0.0);
  const double eta = record.job.last_progress().eta_seconds();
  if (eta > 0) return elapsed + eta;
  const double predicted = PredictedSecondsLeft(record);
  return predicted > 0 ? elapsed + predicted : 0;
}

// Device-steps a stop now would lose: the steps since the newest checkpoint.
int64_t WorkLost(const JobRecord& record) {
  const int64_t step = record.job.last_progress().step();
  const int64_t interval = record.spec.checkpoint.interval;
  const int64_t since = record.spec.checkpoint.dir.empty() ? step
                        : interval > 0                     ? step % interval
                                                           : step;
  return since * static_cast<int64_t>(record.placement->size());
}

}  // namespace

bool JobScheduler::SnapshotNextLocked(const Devices& devices,
                                      const std::set<std::string>& unplaceable,
                                      Snapshot& snapshot) {
  const absl::Time now = absl::Now();
  const int64_t now_ms = absl::ToUnixMillis(now);
  ChargeUsageLocked(now);
  sched::ClusterView view;
  view.now_s = absl::ToDoubleSeconds(now - absl::UnixEpoch());
  view.capacity = devices.capacity;
  view.usage = usage_.UsageAt(view.now_s);
  if (options_.quotas) view.quotas = options_.quotas();
  // Devices by node: `taken` by every job that holds some (what a placement
  // must avoid), `busy` without the restarts waiting here (what is free for
  // the policy: a restart's ranks are out, its devices wait for it).
  std::map<std::string, std::set<int32_t>> taken;
  std::map<std::string, std::set<int32_t>> busy;
  std::vector<const JobRecord*> waiting;  // as view.waiting
  for (const std::string& id : table_->OrderLocked()) {
    JobRecord& record = table_->AtLocked(id);  // the planner's prediction is kept in it
    const JobState state = record.job.state();
    const std::string kind = spec::DeviceKindName(record.spec.resources.device);
    const bool restart_ready = state == JobState::RESTARTING &&
                               now_ms >= record.job.not_before_unix_ms() &&
                               record.ranks_exited == record.ranks.size();
    if (HoldsDevices(state)) {
      for (const auto& p : *record.placement) {
        taken[p.node_id()].insert(p.local_device());
        if (!restart_ready) busy[p.node_id()].insert(p.local_device());
      }
      for (const auto& p : record.job.spare_devices()) {  // a job's own spares are its alone
        taken[p.node_id()].insert(p.local_device());
        if (!restart_ready) busy[p.node_id()].insert(p.local_device());
      }
    }
    if (HoldsDevices(state) && !restart_ready) {
      const double started_s = record.placed_at == absl::InfinitePast()
                                   ? view.now_s
                                   : absl::ToDoubleSeconds(record.placed_at - absl::UnixEpoch());
      view.running.push_back(sched::RunningJob{
          .id = id,
          .user = record.job.owner(),
          .priority = record.spec.scheduling.priority,
          .kind = kind,
          .devices = static_cast<int64_t>(record.placement->size()),
          .started_s = started_s,
          .runtime_s = RuntimeOf(record, started_s, view.now_s),
          .work_lost = WorkLost(record),
          .borrowed = record.job.borrowed(),
          .stopping = record.job.has_stop(),
          // A job without checkpoints cannot save its step: never a victim.
          .preemptible = !record.spec.checkpoint.dir.empty() &&
                         (state == JobState::RUNNING || state == JobState::STARTING)});
      continue;
    }
    // A preempted job waits in line like a new one.
    if (state != JobState::PENDING && state != JobState::PREEMPTED && !restart_ready) continue;
    waiting.push_back(&record);
    // An elastic job placed again (a restart, or after a graceful stop) may
    // start on fewer devices than its size (down to fault_tolerance.min_ranks,
    // or wait saying why): whether it can is PlaceElastic's to say, so the
    // policy lets it try on any free device.
    const bool elastic_restart =
        (state == JobState::RESTARTING || state == JobState::PREEMPTED) &&
        record.spec.fault_tolerance.min_ranks > 0;
    const double promised = record.spec.scheduling.max_runtime_s;
    view.waiting.push_back(sched::WaitingJob{
        .id = id,
        .user = record.job.owner(),
        .priority = record.spec.scheduling.priority,
        .kind = kind,
        .devices = elastic_restart ? 1 : record.spec.resources.world_size(),
        .order = record.sequence,
        // Its promise, or else the planner's prediction of its steps left.
        .runtime_s = promised > 0 ? promised : PredictedSecondsLeft(record),
        .runtime_predicted = promised <= 0,
        .unplaceable = unplaceable.count(id) != 0});
  }
  for (const auto& [node, info] : devices.nodes) {
    const auto& [kind, count] = info;
    int64_t held = 0;
    if (auto t = busy.find(node); t != busy.end()) {
      for (int32_t d : t->second) held += (d >= 0 && d < count) ? 1 : 0;
    }
    view.free[kind] += count - held;
  }
  const std::vector<sched::Decision> decisions = sched::Decide(view, options_.policy);
  std::map<std::string, const JobRecord*> by_id;
  for (const JobRecord* r : waiting) by_id[r->job.id()] = r;
  const JobRecord* next = nullptr;
  bool next_borrowed = false;
  std::vector<QueueEntry> queue;
  queue.reserve(decisions.size());
  for (const sched::Decision& d : decisions) {
    const JobRecord& record = *by_id.at(d.job_id);
    // Preemption: the victims stop gracefully (saving their next step); the
    // job starts when their devices are free, at a later pass.
    for (const std::string& victim : d.victims) {
      JobRecord* v = table_->FindLocked(victim);
      if (v == nullptr) continue;
      lifecycle_->StopGracefullyLocked(
          *v, absl::StrCat("preempted by ", d.job_id, " (priority ",
                           record.spec.scheduling.priority, ")"));
    }
    const bool starts = d.action == sched::Action::kStart || d.action == sched::Action::kBackfill;
    if (starts && next == nullptr) {
      next = &record;
      next_borrowed = d.borrowed;
      continue;
    }
    queue.push_back(QueueEntry{.job_id = d.job_id,
                               .owner = record.job.owner(),
                               .priority = record.spec.scheduling.priority,
                               .kind = spec::DeviceKindName(record.spec.resources.device),
                               .devices = record.spec.resources.world_size(),
                               .created_unix_ms = record.job.created_unix_ms(),
                               .action = d.action,
                               .reason = d.reason,
                               .behind = d.behind});
  }
  if (metrics_ != nullptr) {
    QueueSample sample;
    for (const QueueEntry& e : queue) {
      sample.waiting_by_kind[e.kind] += 1;
      double& oldest = sample.oldest_wait_s_by_priority[e.priority];
      oldest = std::max(oldest, static_cast<double>(now_ms - e.created_unix_ms) / 1000.0);
    }
    for (const sched::RunningJob& r : view.running) sample.held[{r.user, r.kind}] += r.devices;
    sample.quota = view.quotas.users;
    metrics_->Set(sample);
  }
  {
    absl::MutexLock lock(&queue_mu_);
    queue_ = std::move(queue);
  }
  if (next == nullptr) return false;
  snapshot.job_id = next->job.id();
  snapshot.state = next->job.state();
  snapshot.attempt = next->job.attempt();
  snapshot.borrowed = next_borrowed;
  snapshot.spec = next->spec;
  snapshot.resolved_spec_yaml = next->job.resolved_spec_yaml();
  snapshot.spec_yaml = next->job.spec_yaml();
  snapshot.owner = next->job.owner();
  snapshot.checkpoint_dir = next->job.checkpoint_dir();
  snapshot.run_uid = next->job.run_uid();
  snapshot.resume_from_uid = next->job.resume_from_uid();
  for (const auto& [node, failures] : next->node_failures) snapshot.avoid.insert(node);
  // A restart's own old devices are free for it.
  for (const auto& p : *next->placement) {
    if (auto t = taken.find(p.node_id()); t != taken.end()) t->second.erase(p.local_device());
  }
  for (const auto& p : next->job.spare_devices()) {  // and so are its own spares
    if (auto t = taken.find(p.node_id()); t != taken.end()) t->second.erase(p.local_device());
  }
  for (auto& [node, held] : taken) {
    if (!held.empty()) snapshot.taken[node] = std::move(held);
  }
  return true;
}

std::vector<QueueEntry> JobScheduler::Queue() const {
  absl::MutexLock lock(&queue_mu_);
  return queue_;
}

JobScheduler::Result JobScheduler::Place(const Snapshot& snapshot) const {
  Result result;
  const spec::JobSpec& spec = snapshot.spec;
  const std::string kind = spec::DeviceKindName(spec.resources.device);
  topology::PlacementRequest request;
  request.shape = spec::LayoutOf(spec);
  request.avoid = snapshot.avoid;
  for (const NodeInfo& node : nodes_->LiveNodes()) {
    // A node whose session ended takes nothing new until it is back; a
    // drained one nothing until it is uncordoned.
    if (node.device_kind != kind || !node.connected || node.draining) continue;
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
    topology::NodeDevices devices{.node_id = node.node_id, .free_devices = 0, .device_ids = {},
                                  .nvlink_domain = "", .rack = ""};
    for (int32_t d = 0; d < node.device_count; ++d) {
      if (taken == snapshot.taken.end() || taken->second.count(d) == 0) {
        devices.device_ids.push_back(d);
      }
    }
    devices.free_devices = static_cast<int64_t>(devices.device_ids.size());
    if (devices.free_devices == 0) continue;
    // Its place in the network (loom-worker --labels): TP groups inside an
    // NVLink domain, the job in one rack when one holds it (topology/placement.h).
    if (auto d = node.labels.find(topology::kNvlinkDomainLabel); d != node.labels.end()) {
      devices.nvlink_domain = d->second;
    }
    if (auto r = node.labels.find(topology::kRackLabel); r != node.labels.end()) {
      devices.rack = r->second;
    }
    request.nodes.push_back(devices);
  }
  if (std::optional<Result> resized = PlaceElastic(snapshot, request)) return *std::move(resized);
  absl::StatusOr<topology::Placement> placement = topology::PlaceRanks(request);
  if (!placement.ok()) return result;  // waits for devices
  BuildAttempt(snapshot, *placement, nullptr, result);
  if (result.fits) ReserveSpares(spec, request, *placement, snapshot.attempt == 0, result);
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
      context.resume_from_uid = snapshot.resume_from_uid;
    }
  }
  context.run_uid = snapshot.run_uid;
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
  record->job.set_borrowed(snapshot.borrowed);
  lifecycle_->StartAttemptLocked(*record, std::move(result.attempt));
  return true;
}

}  // namespace loom::coordinator
