// Admission, queries and watchers. The life of a placed job (placement,
// progress, exits, restarts) is in job_lifecycle.cc.
#include "coordinator/jobs/job_manager.h"

#include <cstdio>

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

}  // namespace

JobManager::JobManager(JobManagerOptions options, std::unique_ptr<JobStore> store,
                       NodeRegistry* nodes, KvStore* kv, CoordinatorMetrics* metrics,
                       LayoutResolver resolver)
    : options_(std::move(options)),
      store_(std::move(store)),
      nodes_(nodes),
      kv_(kv),
      metrics_(metrics),
      resolver_(std::move(resolver)) {}

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
    record.job = std::move(job);
    if (HoldsDevices(record.job.state())) {
      // Ranks may still be running: watch them for hangs from now on, and give
      // their nodes recovery_grace to reconnect.
      std::vector<std::string> places;
      for (const auto& p : record.job.placement()) places.push_back(p.place());
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

std::string JobManager::NewJobIdLocked() {
  return absl::StrFormat("job-%06d", next_sequence_++);
}

absl::StatusOr<Job> JobManager::Submit(const std::string& spec_yaml,
                                       const std::string& source_name,
                                       const std::string& base_dir,
                                       const std::string& owner) {
  const std::string source = source_name.empty() ? "job spec" : source_name;
  absl::StatusOr<spec::JobSpec> parsed = spec::ParseJobSpecYaml(spec_yaml, source);
  if (!parsed.ok()) return parsed.status();
  spec::JobSpec spec = *std::move(parsed);
  if (absl::Status s = spec::ValidateJobSpec(spec); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", s.message()));
  }
  if (absl::Status s = resolver_(spec); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(source, ": ", s.message()));
  }
  // The planner's choice must obey the same rules as a user's.
  if (absl::Status s = spec::ValidateJobSpec(spec); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": the chosen layout breaks a rule: ", s.message()));
  }

  absl::MutexLock lock(&mu_);
  JobRecord record;
  record.spec = spec;
  Job& job = record.job;
  job.set_id(NewJobIdLocked());
  job.set_name(spec.name);
  job.set_owner(owner);
  job.set_state(JobState::PENDING);
  job.set_spec_yaml(spec_yaml);
  job.set_resolved_spec_yaml(spec::ToYaml(spec));
  *job.mutable_layout() = LayoutOf(spec);
  job.set_base_dir(base_dir.empty() ? options_.state_dir : base_dir);
  job.set_created_unix_ms(NowMs());
  job.set_updated_unix_ms(job.created_unix_ms());
  job.mutable_last_progress()->set_total_steps(spec.train.steps);
  loom::v1::JobEvent* event = job.add_history();
  event->set_time_unix_ms(job.created_unix_ms());
  event->set_state(JobState::PENDING);
  event->set_message(absl::StrCat("accepted: ", spec.resources.world_size(), " ranks, layout dp=",
                                  job.layout().dp(), " tp=", job.layout().tp(), " pp=",
                                  job.layout().pp()));
  // Durable before the caller hears OK; nothing is kept if the write fails.
  if (absl::Status s = store_->Put(job); !s.ok()) {
    --next_sequence_;
    return s;
  }
  const std::string id = job.id();
  order_.push_back(id);
  auto [it, inserted] = jobs_.emplace(id, std::move(record));
  UpdateJobGaugesLocked();
  ScheduleLocked();
  return it->second.job;
}

absl::StatusOr<Job> JobManager::Get(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("job ", id, " does not exist (loomctl list shows jobs)"));
  }
  return it->second.job;
}

std::vector<Job> JobManager::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<Job> jobs;
  for (const std::string& id : order_) jobs.push_back(jobs_.at(id).job);
  return jobs;
}

absl::StatusOr<Job> JobManager::Cancel(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("job ", id, " does not exist (loomctl list shows jobs)"));
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
  return record.job;
}

absl::StatusOr<int64_t> JobManager::Watch(const std::string& id, std::shared_ptr<WatchSink> sink) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("job ", id, " does not exist (loomctl list shows jobs)"));
  }
  JobRecord& record = it->second;
  loom::v1::WatchJobResponse snapshot;
  *snapshot.mutable_job() = record.job;
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
  std::fprintf(stderr, "job %s: %s (attempt %d): %s\n", job.id().c_str(),
               loom::v1::JobState_Name(to).c_str(), job.attempt(), message.c_str());
  PersistLocked(record);
  loom::v1::WatchJobResponse update;
  *update.mutable_job() = job;
  *update.mutable_event() = *event;
  NotifyLocked(record, update);
  UpdateJobGaugesLocked();
}

void JobManager::PersistLocked(JobRecord& record) {
  record.last_persist = absl::Now();
  if (absl::Status s = store_->Put(record.job); !s.ok()) {
    std::fprintf(stderr, "job %s: could not persist: %s\n", record.job.id().c_str(),
                 std::string(s.message()).c_str());
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
