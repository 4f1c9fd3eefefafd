#include "coordinator/jobs/job_manager.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/spec/job_spec_yaml.h"
#include "coordinator/jobs/job_states.h"
#include "coordinator/service/metrics.h"

namespace loom::coordinator {

using loom::v1::Job;
using loom::v1::JobState;

namespace {

// What the scheduler reads of the quota book on every pass; none without one.
std::function<sched::Quotas()> QuotasOf(const QuotaBook* book) {
  if (book == nullptr) return {};
  return [book] { return book->Current()->quotas; };
}

// Admission's check of an owner's scheduling.priority against their cap.
std::function<absl::Status(const std::string&, const spec::JobSpec&)> PriorityCapOf(
    const QuotaBook* book) {
  if (book == nullptr) return {};
  return [book](const std::string& owner, const spec::JobSpec& spec) {
    return book->CheckPriority(owner, spec.scheduling.priority);
  };
}

}  // namespace

JobManagerOptions JobManager::WithDefaultRoots(JobManagerOptions options) {
  if (options.roots.data_roots.empty()) options.roots.data_roots = {options.state_dir + "/data"};
  if (options.roots.checkpoint_root.empty()) {
    options.roots.checkpoint_root = options.state_dir + "/checkpoints";
  }
  return options;
}

JobManager::JobManager(JobManagerOptions options, std::unique_ptr<JobStore> store,
                       NodeRegistry* nodes, KvStore* kv, CoordinatorMetrics* metrics,
                       LayoutResolver resolver)
    : options_(WithDefaultRoots(std::move(options))),
      store_(std::move(store)),
      nodes_(nodes),
      metrics_(metrics),
      hub_(options_.max_watchers_per_job),
      persister_(store_.get(), options_.persister),
      table_({.job_id_prefix = options_.job_id_prefix,
              .default_page_size = options_.default_page_size,
              .max_page_size = options_.max_page_size},
             &persister_, &hub_),
      lifecycle_({.kill_grace_seconds = options_.kill_grace_seconds,
                  .recovery_grace = options_.recovery_grace,
                  .hang_policy = options_.hang_policy,
                  .node_timeout = options_.node_timeout,
                  .stop_grace = options_.stop_grace,
                  .job_metrics_grace = options_.job_metrics_grace},
                 &table_, &hub_, &metrics_, nodes, kv),
      scheduler_({.collective_timeout_s = options_.collective_timeout_s,
                  .rank_token_issuer = options_.rank_token_issuer,
                  .max_launch_bytes = options_.max_launch_bytes,
                  .roots = options_.roots,
                  .policy = options_.scheduling,
                  .fair_share_half_life_s = options_.fair_share_half_life_s,
                  .quotas = QuotasOf(options_.quota_book),
                  .metrics = metrics},
                 &table_, &lifecycle_, nodes),
      admission_({.max_spec_bytes = options_.max_spec_bytes,
                  .max_job_ranks = options_.max_job_ranks,
                  .max_queued_submissions = options_.max_queued_submissions,
                  .max_launch_bytes = options_.max_launch_bytes,
                  .roots = options_.roots,
                  .check_owner = PriorityCapOf(options_.quota_book)},
                 std::move(resolver), &table_, &persister_, &lifecycle_) {
  persister_.Start([this](std::vector<WriteResult> results) { table_.OnWritten(std::move(results)); },
                   [this](const absl::Status& why) { Fenced(why); });
  scheduler_.Start();
  admission_.Start();
}

JobManager::~JobManager() { Stop(); }

void JobManager::Stop() {
  if (stopped_) return;
  stopped_ = true;
  admission_.Stop();
  {
    absl::MutexLock lock(&table_.mu());
    // Progress and steps are stored at most once a second while jobs run;
    // the last of them go now, so that a watch after the restart replays
    // every step.
    for (const std::string& id : table_.OrderLocked()) {
      JobRecord& record = table_.AtLocked(id);
      if (HoldsDevices(record.job.state()) || !hub_.Unstored(id).chunks.empty()) {
        table_.PersistLocked(record, Durability::kSoft);
      }
    }
    // Graceful: what was decided is still stored and sent below; not
    // fenced, so no caller is let go here (none is answered).
    const std::vector<std::function<void()>> none = table_.StopActingLocked(
        /*fenced=*/false, absl::UnavailableError("this coordinator is stopping; retry"));
    (void)none;
  }
  persister_.Stop();  // writes what was queued; held effects are released
  std::vector<std::function<void()>> answers;
  {
    // Callers whose change could not be stored before the stop (the store
    // failed) hear so; none is left waiting.
    absl::MutexLock lock(&table_.mu());
    answers = table_.AbandonWaitersLocked(absl::UnavailableError(
        "this coordinator stopped before the change could be stored; nothing was changed, retry"));
  }
  for (auto& answer : answers) answer();
  scheduler_.Stop();  // sends them
}

bool JobManager::Acting() const {
  absl::MutexLock lock(&table_.mu());
  return table_.ActingLocked();
}

void JobManager::NoLongerLeading(const absl::Status& why) {
  std::vector<std::function<void()>> answers;
  {
    absl::MutexLock lock(&table_.mu());
    answers = table_.StopActingLocked(/*fenced=*/true, why);
  }
  for (auto& answer : answers) answer();
}

void JobManager::Fenced(const absl::Status& why) {
  NoLongerLeading(why);
  std::fprintf(stderr, "loom-coordinator: %s; no longer acting as the leader\n",
               std::string(why.message()).c_str());
  if (options_.on_fenced) options_.on_fenced(why);
}

absl::Status JobManager::Recover() {
  absl::StatusOr<std::vector<Job>> jobs = store_->LoadAll();
  if (!jobs.ok()) return jobs.status();
  absl::StatusOr<std::map<std::string, StoredSteps>> steps = store_->LoadSteps();
  if (!steps.ok()) return steps.status();
  absl::StatusOr<int64_t> max_sequence = store_->MaxSequence();
  if (!max_sequence.ok()) return max_sequence.status();
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&table_.mu());
  table_.SetNextSequenceLocked(*max_sequence + 1);
  for (Job& job : *jobs) {
    JobRecord record;
    absl::StatusOr<spec::JobSpec> spec =
        spec::ParseJobSpecYaml(job.resolved_spec_yaml(), absl::StrCat("job ", job.id()));
    if (!spec.ok()) return spec.status();
    record.spec = *std::move(spec);
    record.sequence = JobIdSequence(job.id());
    for (const auto& p : job.placement()) record.peak_flops += p.peak_flops();
    auto placement = std::make_shared<Placement>();
    placement->Swap(job.mutable_placement());
    record.placement = std::move(placement);
    record.job = std::move(job);
    const std::string id = record.job.id();
    if (auto it = steps->find(id); it != steps->end()) hub_.Restore(id, std::move(it->second));
    lifecycle_.RecoveredLocked(table_.InsertLocked(std::move(record)), now);
  }
  lifecycle_.UpdateJobGaugesLocked();
  return absl::OkStatus();
}

void JobManager::SubmitAsync(std::string spec_yaml, std::string source_name, std::string base_dir,
                             std::string owner, JobCallback done) {
  admission_.SubmitAsync(std::move(spec_yaml), std::move(source_name), std::move(base_dir),
                         std::move(owner), std::move(done));
}

namespace {

// Runs an asynchronous call and waits for its answer (tests, in-process callers).
template <typename T, typename Call>
T Await(Call call) {
  absl::Notification done;
  T result;
  call([&](T value) {
    result = std::move(value);
    done.Notify();
  });
  done.WaitForNotification();
  return result;
}

}  // namespace

absl::StatusOr<Job> JobManager::Submit(const std::string& spec_yaml,
                                       const std::string& source_name,
                                       const std::string& base_dir, const std::string& owner) {
  return Await<absl::StatusOr<Job>>(
      [&](JobCallback done) { SubmitAsync(spec_yaml, source_name, base_dir, owner, done); });
}

absl::StatusOr<Job> JobManager::Get(const std::string& id, loom::v1::JobView view) const {
  return table_.Get(id, view);
}

absl::StatusOr<JobPage> JobManager::List(int32_t page_size, const std::string& page_token,
                                         const std::function<bool(const Job&)>& visible) const {
  return table_.List(page_size, page_token, visible);
}

void JobManager::CancelAsync(const std::string& id, JobCallback done) {
  lifecycle_.Cancel(id, std::move(done));
}

absl::StatusOr<Job> JobManager::Cancel(const std::string& id) {
  return Await<absl::StatusOr<Job>>([&](JobCallback done) { CancelAsync(id, done); });
}

void JobManager::DeleteAsync(const std::string& id, StatusCallback done) {
  absl::Status refused;
  {
    absl::MutexLock lock(&table_.mu());
    const JobRecord* record = table_.FindLocked(id);
    if (!table_.ActingLocked()) {
      refused = table_.NotActingLocked();
    } else if (record == nullptr) {
      refused = JobTable::NotFound(id);
    } else if (!IsTerminal(record->stored->state())) {
      // The stored state decides: an end not stored yet may still be put back.
      refused = absl::FailedPreconditionError(absl::StrCat(
          "job ", id, " is ", loom::v1::JobState_Name(record->stored->state()),
          "; only a job that has ended can be deleted (loomctl cancel ", id, " first)"));
    }
  }
  if (!refused.ok()) {
    done(refused);
    return;
  }
  // An ended job never changes again; its last record, if still queued, is
  // written before the delete.
  persister_.Delete({id}, [this, id, done = std::move(done)](absl::Status status) {
    if (status.ok()) {
      absl::MutexLock lock(&table_.mu());
      ForgetLocked({id});
    }
    done(status);
  });
}

absl::Status JobManager::Delete(const std::string& id) {
  return Await<absl::Status>([&](StatusCallback done) { DeleteAsync(id, done); });
}

void JobManager::ForgetLocked(const std::vector<std::string>& ids) {
  for (const std::string& id : ids) {
    const JobRecord* record = table_.FindLocked(id);
    if (record == nullptr) continue;
    metrics_.RemoveJob(record->job, std::max<int>(record->placement->size(),
                                                  static_cast<int>(record->ranks.size())));
  }
  table_.ForgetLocked(ids);
  lifecycle_.UpdateJobGaugesLocked();
}

absl::StatusOr<int64_t> JobManager::Watch(const std::string& id, std::shared_ptr<WatchSink> sink) {
  absl::MutexLock lock(&table_.mu());
  const JobRecord* record = table_.FindLocked(id);
  if (record == nullptr) return JobTable::NotFound(id);
  // What the store holds: a change still being stored reaches the watcher
  // as an update once it is.
  loom::v1::WatchJobResponse snapshot;
  *snapshot.mutable_job() = WatchHub::WatchView(table_.ShownLocked(*record));
  return hub_.Subscribe(id, std::move(snapshot), IsTerminal(record->stored->state()),
                        std::move(sink));
}

void JobManager::Unwatch(const std::string& id, int64_t handle) {
  absl::MutexLock lock(&table_.mu());
  hub_.Unsubscribe(id, handle);
}

void JobManager::OnNodeRegistered(const loom::v1::RegisterNode& registration) {
  lifecycle_.OnNodeRegistered(registration);
}

void JobManager::OnNodeLost(const std::string& node_id, const std::string& why) {
  lifecycle_.OnNodeLost(node_id, why);
}

void JobManager::OnNodeRevived(const std::string& node_id,
                               const std::vector<loom::v1::RunningRank>& running) {
  lifecycle_.OnNodeRevived(node_id, running);
}

void JobManager::OnNodeHeartbeat(const std::string& node_id, const loom::v1::Heartbeat& heartbeat) {
  lifecycle_.OnNodeHeartbeat(node_id, heartbeat);
}

void JobManager::OnRankExited(const std::string& node_id, const loom::v1::RankExited& exit) {
  lifecycle_.OnRankExited(node_id, exit);
}

ProgressBatchResult JobManager::OnRankProgressBatch(const std::string& node_id,
                                                    const loom::v1::RankProgressBatch& batch) {
  return lifecycle_.OnRankProgressBatch(node_id, batch);
}

void JobManager::Schedule() { scheduler_.Schedule(); }

void JobManager::WaitIdle() {
  // A placement is stored, then its launches are sent: until a round in
  // which the persister wrote nothing new. A write releases what waited for
  // it into the outbox before it is counted, so every write counted by the
  // time `writes` is read has its messages sent by the pass that follows
  // (the scheduler flushes the outbox at each pass); a write after that read
  // changes the count and goes round again.
  while (true) {
    scheduler_.WaitHandled();
    persister_.WaitIdle();
    const int64_t writes = persister_.writes();
    scheduler_.WaitHandled();
    persister_.WaitIdle();
    if (persister_.writes() == writes) return;
  }
}

void JobManager::CheckHealth(absl::Time now) {
  lifecycle_.CheckHealth(now);
  SweepEndedJobs(now);
}

void JobManager::SweepEndedJobs(absl::Time now) {
  std::vector<std::string> expired;
  {
    absl::MutexLock lock(&table_.mu());
    if (!table_.ActingLocked() || now - last_sweep_ < absl::Seconds(10)) return;
    last_sweep_ = now;
    const int64_t cutoff = absl::ToUnixMillis(now - options_.finished_job_retention);
    for (const std::string& id : table_.OrderLocked()) {
      JobRecord& record = table_.AtLocked(id);
      if (now >= record.drop_metrics_at) {
        metrics_.RemoveJob(record.job, std::max<int>(record.placement->size(),
                                                     static_cast<int>(record.ranks.size())));
        record.drop_metrics_at = absl::InfiniteFuture();
      }
      const Job& stored = *record.stored;
      if (IsTerminal(stored.state()) && stored.updated_unix_ms() < cutoff &&
          deleting_.insert(id).second) {
        expired.push_back(id);
      }
    }
  }
  if (expired.empty()) return;
  // One delete however many expired, by the persister: the liveness tick
  // that calls this never waits on the store.
  persister_.Delete(expired, [this, expired](absl::Status status) {
    if (!status.ok()) {
      std::fprintf(stderr, "could not delete %zu jobs past their retention (retried): %s\n",
                   expired.size(), std::string(status.message()).c_str());
    }
    absl::MutexLock lock(&table_.mu());
    for (const std::string& id : expired) deleting_.erase(id);
    if (status.ok()) ForgetLocked(expired);
  });
}

std::vector<loom::v1::Node> JobManager::ListNodes() const {
  std::map<std::string, int32_t> in_use;
  {
    absl::MutexLock lock(&table_.mu());
    for (const std::string& id : table_.OrderLocked()) {
      const JobRecord& record = table_.AtLocked(id);
      if (!HoldsDevices(record.job.state())) continue;
      for (const auto& p : *record.placement) ++in_use[p.node_id()];
      for (const auto& p : record.job.spare_devices()) ++in_use[p.node_id()];
    }
  }
  std::vector<loom::v1::Node> nodes;
  for (const NodeInfo& info : nodes_->AllNodes()) {
    loom::v1::Node& node = nodes.emplace_back();
    node.set_node_id(info.node_id);
    node.set_hostname(info.hostname);
    node.set_address(info.address);
    node.set_live(info.live);
    node.set_cordoned(info.cordoned);
    node.set_draining(info.draining);
    node.set_spare(info.spare);
    node.mutable_labels()->insert(info.labels.begin(), info.labels.end());
    node.set_cordon_reason(info.cordon_reason);
    node.set_device_kind(info.device_kind);
    node.set_device_count(info.device_count);
    node.set_devices_in_use(in_use[info.node_id]);
    node.set_peak_flops_per_device(info.peak_flops_per_device);
  }
  return nodes;
}

absl::StatusOr<loom::v1::Node> JobManager::Drain(const std::string& node_id,
                                                  const std::string& reason) {
  if (absl::Status s = nodes_->Drain(node_id, reason); !s.ok()) return s;
  int stopping = 0;
  {
    absl::MutexLock lock(&table_.mu());
    if (!table_.ActingLocked()) return table_.NotActingLocked();
    stopping = lifecycle_.DrainNodeLocked(node_id, reason);
    table_.RequestScheduleLocked();
  }
  std::fprintf(stderr, "node %s: drained (%s); %d jobs stop gracefully\n", node_id.c_str(),
               reason.c_str(), stopping);
  for (loom::v1::Node& node : ListNodes()) {
    if (node.node_id() == node_id) return node;
  }
  return absl::NotFoundError(absl::StrCat("node ", node_id, " is not known"));
}

absl::StatusOr<loom::v1::Node> JobManager::Uncordon(const std::string& node_id) {
  if (absl::Status s = nodes_->Uncordon(node_id); !s.ok()) return s;
  std::fprintf(stderr, "node %s: uncordoned\n", node_id.c_str());
  Schedule();
  for (loom::v1::Node& node : ListNodes()) {
    if (node.node_id() == node_id) return node;
  }
  return absl::NotFoundError(absl::StrCat("node ", node_id, " is not known"));
}

}  // namespace loom::coordinator
