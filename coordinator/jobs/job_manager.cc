// Admission, queries and watchers. The life of a placed job (placement,
// progress, exits, restarts) is in job_lifecycle.cc.
#include "coordinator/jobs/job_manager.h"

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/spec/job_spec_rules.h"
#include "common/spec/job_spec_yaml.h"
#include "coordinator/jobs/assignment_builder.h"
#include "coordinator/jobs/job_states.h"
#include "coordinator/health/hang_detector.h"
#include "coordinator/service/metrics.h"

namespace loom::coordinator {

using loom::v1::Job;
using loom::v1::JobState;

namespace {

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

// The number in "job-000042"; 0 when there is none.
int64_t SequenceOf(const std::string& id) {
  int64_t sequence = 0;
  const size_t dash = id.find_last_of('-');
  if (dash == std::string::npos || !absl::SimpleAtoi(id.substr(dash + 1), &sequence)) return 0;
  return sequence;
}

// What ListJobs shows of a job: everything but the parts that grow with the
// spec and the restarts (GetJob has those; the placement is never in the
// record's Job).
Job Summary(const Job& job) {
  Job summary = job;
  summary.clear_spec_yaml();
  summary.clear_resolved_spec_yaml();
  summary.clear_history();
  summary.clear_incidents();
  summary.clear_store_namespace();
  if (job.history_size() > 0) *summary.add_history() = job.history(job.history_size() - 1);
  return summary;
}

}  // namespace

JobManager::JobManager(JobManagerOptions options, std::unique_ptr<JobStore> store,
                       NodeRegistry* nodes, KvStore* kv, CoordinatorMetrics* metrics,
                       LayoutResolver resolver)
    : options_(WithDefaultRoots(std::move(options))),
      store_(std::move(store)),
      nodes_(nodes),
      kv_(kv),
      metrics_(metrics),
      resolver_(std::move(resolver)) {
  scheduler_ = std::thread([this] { SchedulerLoop(); });
  admission_ = std::thread([this] { AdmissionLoop(); });
  persister_ = std::thread([this] { PersisterLoop(); });
}

JobManager::~JobManager() {
  {
    absl::MutexLock lock(&admission_mu_);
    admission_stopping_ = true;
  }
  admission_.join();  // answers what was queued first
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  scheduler_.join();
  persister_.join();  // writes what was queued first
}

absl::Status JobManager::Recover() {
  absl::StatusOr<std::vector<Job>> jobs = store_->LoadAll();
  if (!jobs.ok()) return jobs.status();
  absl::StatusOr<int64_t> max_sequence = store_->MaxSequence();
  if (!max_sequence.ok()) return max_sequence.status();
  absl::MutexLock lock(&mu_);
  next_sequence_ = *max_sequence + 1;
  for (Job& job : *jobs) {
    JobRecord record;
    absl::StatusOr<spec::JobSpec> spec =
        spec::ParseJobSpecYaml(job.resolved_spec_yaml(), absl::StrCat("job ", job.id()));
    if (!spec.ok()) return spec.status();
    record.spec = *spec;
    record.ranks.resize(job.placement_size());
    record.sequence = SequenceOf(job.id());
    for (const auto& p : job.placement()) record.peak_flops += p.peak_flops();
    auto placement = std::make_shared<Placement>();
    placement->Swap(job.mutable_placement());
    record.placement = std::move(placement);
    // Ranks of a live attempt may still meet in its namespace (a job stored
    // before namespaces had random names uses the readable one).
    if (HoldsDevices(job.state()) && job.attempt() > 0) {
      if (job.store_namespace().empty()) {
        job.set_store_namespace(StoreNamespace(job.id(), job.attempt()));
      }
      kv_->OpenNamespace(job.store_namespace());
    }
    record.job = std::move(job);
    if (HoldsDevices(record.job.state())) {
      // Ranks may still be running: watch them for hangs from now on, and give
      // their nodes recovery_grace to reconnect.
      std::vector<std::string> places;
      for (const auto& p : *record.placement) places.push_back(p.place());
      HangPolicy policy = options_.hang_policy;
      policy.fixed_timeout = absl::Seconds(record.spec.fault_tolerance.hang_timeout_s);
      record.hang = std::make_unique<HangDetector>(policy, std::move(places), absl::Now());
      recovered_at_ = absl::Now();
    }
    const std::string id = record.job.id();
    order_.push_back(id);
    jobs_.emplace(id, std::move(record));
  }
  UpdateJobGaugesLocked();
  return absl::OkStatus();
}

JobManagerOptions JobManager::WithDefaultRoots(JobManagerOptions options) {
  if (options.roots.data_roots.empty()) options.roots.data_roots = {options.state_dir + "/data"};
  if (options.roots.checkpoint_root.empty()) {
    options.roots.checkpoint_root = options.state_dir + "/checkpoints";
  }
  return options;
}

std::string JobManager::NewJobIdLocked() {
  if (options_.job_id_prefix.empty()) return absl::StrFormat("job-%06d", next_sequence_++);
  return absl::StrFormat("job-%s-%06d", options_.job_id_prefix, next_sequence_++);
}

absl::StatusOr<Job> JobManager::Get(const std::string& id, loom::v1::JobView view) const {
  Job job;
  std::shared_ptr<const Placement> placement;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) {
      return absl::NotFoundError(
          absl::StrCat("job ", id, " does not exist (loomctl list shows jobs)"));
    }
    job = it->second.job;  // small: the placement is not in it
    if (view == loom::v1::JOB_VIEW_FULL) placement = it->second.placement;
  }
  job.clear_store_namespace();  // only the attempt's ranks are told it
  // The placement is immutable: copied without the lock, on the caller's thread.
  if (placement != nullptr) *job.mutable_placement() = *placement;
  return job;
}

Job JobManager::WatchView(const Job& job) {
  Job view = job;
  view.clear_spec_yaml();
  view.clear_resolved_spec_yaml();
  view.clear_store_namespace();
  return view;
}

std::vector<std::string> JobManager::SweepEndedJobsLocked(absl::Time now) {
  if (now - last_retention_sweep_ < absl::Seconds(10)) return {};
  last_retention_sweep_ = now;
  const int64_t cutoff = absl::ToUnixMillis(now - options_.finished_job_retention);
  std::vector<std::string> expired;
  for (const std::string& id : order_) {
    JobRecord& record = jobs_.at(id);
    if (now >= record.drop_metrics_at) {
      DropJobMetricsLocked(record);
      record.drop_metrics_at = absl::InfiniteFuture();
    }
    const Job& job = record.job;
    if (IsTerminal(job.state()) && job.updated_unix_ms() < cutoff) expired.push_back(id);
  }
  ForgetLocked(expired);
  return expired;
}

absl::StatusOr<JobPage> JobManager::List(int32_t page_size, const std::string& page_token,
                                         const std::function<bool(const Job&)>& visible) const {
  if (page_size < 0) {
    return absl::InvalidArgumentError(absl::StrCat("page_size=", page_size, " must not be negative"));
  }
  const int32_t size = page_size == 0 ? options_.default_page_size
                                      : std::min(page_size, options_.max_page_size);
  int64_t after = 0;  // the sequence of the last job of the previous page
  if (!page_token.empty() && (!absl::SimpleAtoi(page_token, &after) || after < 0)) {
    return absl::InvalidArgumentError(
        "page_token is not one this coordinator gave (use next_page_token of the previous page)");
  }
  absl::MutexLock lock(&mu_);
  JobPage page;
  // order_ is sorted by sequence: start after the token by binary search.
  auto it = std::upper_bound(order_.begin(), order_.end(), after,
                             [this](int64_t value, const std::string& id)
                                 ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                   return value < jobs_.at(id).sequence;
                                 });
  for (; it != order_.end() && static_cast<int32_t>(page.jobs.size()) < size; ++it) {
    const Job& job = jobs_.at(*it).job;
    if (visible && !visible(job)) continue;
    page.jobs.push_back(Summary(job));
  }
  if (it != order_.end() && !page.jobs.empty()) {
    page.next_page_token = absl::StrCat(jobs_.at(*std::prev(it)).sequence);
  }
  return page;
}

absl::Status JobManager::Delete(const std::string& id) {
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) {
      return absl::NotFoundError(
          absl::StrCat("job ", id, " does not exist (loomctl list shows jobs)"));
    }
    if (!IsTerminal(it->second.job.state())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", id, " is ", loom::v1::JobState_Name(it->second.job.state()),
          "; only a job that has ended can be deleted (loomctl cancel ", id, " first)"));
    }
  }
  // An ended job never changes again, so the write needs no lock; its last
  // record must be written first, or it would come back after the delete.
  WaitPersisted();
  if (absl::Status s = store_->Delete({id}); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  ForgetLocked({id});
  return absl::OkStatus();
}

void JobManager::ForgetLocked(const std::vector<std::string>& ids) {
  if (ids.empty()) return;
  const std::set<std::string> gone(ids.begin(), ids.end());
  for (const std::string& id : ids) {
    auto it = jobs_.find(id);
    if (it == jobs_.end()) continue;
    DropJobMetricsLocked(it->second);
    jobs_.erase(it);
  }
  // One pass, however many go.
  order_.erase(std::remove_if(order_.begin(), order_.end(),
                              [&gone](const std::string& id) { return gone.count(id) > 0; }),
               order_.end());
  UpdateJobGaugesLocked();
}

void JobManager::DropJobMetricsLocked(const JobRecord& record) {
  if (metrics_ == nullptr) return;
  metrics_->RemoveJob(record.job.id(), record.job.name(),
                      std::max<int>(record.placement->size(),
                                    static_cast<int>(record.ranks.size())));
}

absl::StatusOr<Job> JobManager::Cancel(const std::string& id) {
  Job cancelled;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) {
      return absl::NotFoundError(
          absl::StrCat("job ", id, " does not exist (loomctl list shows jobs)"));
    }
    JobRecord& record = it->second;
    if (IsTerminal(record.job.state())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", id, " already ended ", loom::v1::JobState_Name(record.job.state())));
    }
    const bool had_ranks = HoldsDevices(record.job.state());
    TransitionLocked(record, JobState::CANCELLED, "cancelled by the user");
    if (had_ranks) KillRanksLocked(record);
    FinishAttemptLocked(record);
    ScheduleLocked();
    cancelled = record.job;
  }
  WaitPersisted();  // durable before the caller hears it
  return cancelled;
}

absl::StatusOr<int64_t> JobManager::Watch(const std::string& id, std::shared_ptr<WatchSink> sink) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("job ", id, " does not exist (loomctl list shows jobs)"));
  }
  JobRecord& record = it->second;
  if (static_cast<int64_t>(record.watchers.size()) >= options_.max_watchers_per_job) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "job ", id, " already has ", record.watchers.size(), " watchers (at most ",
        options_.max_watchers_per_job, ", --max_watchers_per_job)"));
  }
  loom::v1::WatchJobResponse snapshot;
  *snapshot.mutable_job() = WatchView(record.job);
  for (const loom::v1::JobProgress& step : record.steps) *snapshot.add_backlog() = step;
  const bool ended = IsTerminal(record.job.state());
  sink->Push(snapshot, ended);
  if (ended) return int64_t{0};
  const int64_t handle = next_watch_handle_++;
  record.watchers[handle] = std::move(sink);
  return handle;
}

void JobManager::Unwatch(const std::string& id, int64_t handle) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it != jobs_.end()) it->second.watchers.erase(handle);
}

void JobManager::TransitionLocked(JobRecord& record, JobState to, const std::string& message) {
  Job& job = record.job;
  if (!CanTransition(job.state(), to)) return;
  job.set_state(to);
  job.set_updated_unix_ms(NowMs());
  loom::v1::JobEvent* event = job.add_history();
  event->set_time_unix_ms(job.updated_unix_ms());
  event->set_state(to);
  event->set_attempt(job.attempt());
  event->set_message(message);
  if (to == JobState::FAILED) job.set_failure_reason(message);
  // An ended job's series leave the scrape after a grace (its history stays
  // in GetJob), so series do not pile up over jobs.
  if (IsTerminal(to)) {
    record.drop_metrics_at = absl::Now() + options_.job_metrics_grace;
    // A recovery the job's end cut short; the goodput over its whole run.
    ObserveIncidentLocked(CloseIncident(job, absl::Now()));
    const double goodput = GoodputTracker::Update(job, absl::Now());
    if (metrics_ != nullptr && job.first_running_unix_ms() != 0) {
      metrics_->SetJobGoodput(job.id(), job.name(), goodput);
    }
  }
  std::fprintf(stderr, "job %s: %s (attempt %d): %s\n", job.id().c_str(),
               loom::v1::JobState_Name(to).c_str(), job.attempt(), message.c_str());
  PersistLocked(record);
  loom::v1::WatchJobResponse update;
  *update.mutable_job() = WatchView(job);
  *update.mutable_event() = *event;
  NotifyLocked(record, update);
  UpdateJobGaugesLocked();
}

void JobManager::PersistLocked(JobRecord& record) {
  record.last_persist = absl::Now();
  // Both are small or shared: the placement is not copied here.
  persist_pending_[record.job.id()] = {record.job, record.placement};
  ++persists_queued_;
}

void JobManager::WaitPersisted() {
  absl::MutexLock lock(&mu_);
  const int64_t target = persists_queued_;
  auto done = [this, target]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return persists_done_ >= target || persister_stopped_;
  };
  mu_.Await(absl::Condition(&done));
}

void JobManager::PersisterLoop() {
  // Persisting under mu_ on the reaction that changed the job held every RPC
  // for a 16,384-rank job's serialization and fsync once a second
  // (docs/scale.md). One thread writes instead, a batch per transaction.
  while (true) {
    std::map<std::string, PendingWrite> batch;
    int64_t target = 0;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !persist_pending_.empty() || stopping_;
      };
      mu_.Await(absl::Condition(&ready));
      if (persist_pending_.empty()) {  // stopping, and everything is written
        persister_stopped_ = true;
        return;
      }
      batch.swap(persist_pending_);
      target = persists_queued_;
    }
    // The stored record is whole: the placement joins it here, off the lock.
    std::vector<Job> whole;
    whole.reserve(batch.size());
    for (auto& [id, pending] : batch) {
      Job& job = whole.emplace_back(std::move(pending.job));
      if (pending.placement != nullptr) *job.mutable_placement() = *pending.placement;
    }
    std::vector<const Job*> jobs;
    for (const Job& job : whole) jobs.push_back(&job);
    if (absl::Status s = store_->PutAll(jobs); !s.ok()) {
      std::fprintf(stderr, "could not persist %zu jobs: %s\n", jobs.size(),
                   std::string(s.message()).c_str());
    }
    absl::MutexLock lock(&mu_);
    persists_done_ = target;
  }
}

void JobManager::NotifyLocked(JobRecord& record, const loom::v1::WatchJobResponse& update) {
  const bool last = IsTerminal(record.job.state());
  for (auto& [handle, sink] : record.watchers) sink->Push(update, last);
  if (last) record.watchers.clear();
}

void JobManager::UpdateJobGaugesLocked() {
  if (metrics_ == nullptr) return;
  std::map<std::string, int> counts;
  for (int s = JobState::PENDING; s <= JobState::CANCELLED; ++s) {
    counts[loom::v1::JobState_Name(static_cast<JobState>(s))] = 0;
  }
  for (const auto& [id, record] : jobs_) ++counts[loom::v1::JobState_Name(record.job.state())];
  metrics_->SetJobsByState(counts);
}

}  // namespace loom::coordinator
