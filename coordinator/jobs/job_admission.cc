#include "coordinator/jobs/job_admission.h"

#include "coordinator/jobs/assignment_builder.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/spec/job_spec_rules.h"
#include "common/spec/job_spec_yaml.h"
#include "coordinator/jobs/assignment_builder.h"
#include "coordinator/jobs/layout_proto.h"

namespace loom::coordinator {

using loom::v1::Job;
using loom::v1::JobState;

JobAdmission::JobAdmission(AdmissionOptions options, LayoutResolver resolver, JobTable* table,
                           JobPersister* persister, JobLifecycle* lifecycle)
    : options_(std::move(options)),
      resolver_(std::move(resolver)),
      table_(table),
      persister_(persister),
      lifecycle_(lifecycle) {}

JobAdmission::~JobAdmission() { Stop(); }

void JobAdmission::Start() { thread_ = std::thread([this] { Loop(); }); }

void JobAdmission::Stop() {
  std::deque<Request> left;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
  {
    absl::MutexLock lock(&mu_);
    left.swap(queue_);
  }
  for (Request& r : left) {
    r.done(absl::UnavailableError("the coordinator is stopping; submit again"));
  }
}

void JobAdmission::SubmitAsync(std::string spec_yaml, std::string source_name,
                               std::string base_dir, std::string owner, SubmitCallback done) {
  absl::Status refused;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      refused = absl::UnavailableError("the coordinator is stopping; submit again");
    } else if (static_cast<int64_t>(queue_.size()) < options_.max_queued_submissions) {
      queue_.push_back(Request{std::move(spec_yaml), std::move(source_name), std::move(base_dir),
                               std::move(owner), std::move(done)});
      return;
    } else {
      refused = absl::ResourceExhaustedError(absl::StrCat(
          "the coordinator already has ", options_.max_queued_submissions,
          " submissions waiting to be admitted; retry later"));
    }
  }
  done(refused);
}

absl::StatusOr<spec::JobSpec> JobAdmission::Check(const std::string& spec_yaml,
                                                  const std::string& source_name,
                                                  const std::string& base_dir) const {
  // Bounded before anything is parsed or echoed: the spec and its name are
  // kept with the job and copied into every reply that shows it.
  if (static_cast<int64_t>(spec_yaml.size()) > options_.max_spec_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec_yaml is ", spec_yaml.size(), " bytes; a job spec may be at most ",
        options_.max_spec_bytes, " bytes (--max_spec_bytes)"));
  }
  if (source_name.size() > 1024 || base_dir.size() > 4096) {
    return absl::InvalidArgumentError(
        "source_name must be at most 1024 bytes and base_dir at most 4096 bytes");
  }
  const std::string source = source_name.empty() ? "job spec" : source_name;
  absl::StatusOr<spec::JobSpec> parsed = spec::ParseJobSpecYaml(spec_yaml, source);
  if (!parsed.ok()) return parsed.status();
  spec::JobSpec spec = *std::move(parsed);
  if (absl::Status s = spec::ValidateJobSpec(spec); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", s.message()));
  }
  // A job larger than the cluster could ever hold would wait at the head of
  // the queue forever and block every job behind it.
  if (spec.resources.world_size() > options_.max_job_ranks) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": ", spec.resources.device == spec::DeviceKind::kCpu
                          ? "resources.ranks"
                          : "resources.nodes x resources.gpus_per_node",
        "=", spec.resources.world_size(), " must be at most ", options_.max_job_ranks,
        " (the most ranks this cluster gives one job, --max_job_ranks)"));
  }
  if (absl::Status s = resolver_(spec); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(source, ": ", s.message()));
  }
  // The planner's choice must obey the same rules as a user's.
  if (absl::Status s = spec::ValidateJobSpec(spec); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": the chosen layout breaks a rule: ", s.message()));
  }
  if (absl::Status s = CheckLaunchSizeLowerBound(spec, options_.max_launch_bytes); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(source, ": ", s.message()));
  }
  // Paths only beneath the configured roots; the client's base_dir is not used.
  if (absl::Status s = ConfineSpecPaths(spec, options_.roots); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(source, ": ", s.message()));
  }
  return spec;
}

absl::Status JobAdmission::AssignCheckpointDirLocked(const spec::JobSpec& spec, Job& job) {
  absl::StatusOr<std::string> checkpoint_dir =
      CheckpointDirOf(spec, options_.roots, job.owner(), job.id());
  if (!checkpoint_dir.ok()) return checkpoint_dir.status();
  job.set_checkpoint_dir(*checkpoint_dir);
  if (const std::string& from = spec.checkpoint.resume_from; !from.empty()) {
    // The same answer for a job that does not exist and another owner's, so
    // that nobody learns which ids exist.
    const JobRecord* source = table_->FindLocked(from);
    if (source == nullptr || source->job.owner() != job.owner()) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint.resume_from='", from, "' is not one of your jobs"));
    }
    // Its ranks get that job's group, to read its checkpoints (0750).
    job.set_resume_from_uid(source->job.run_uid());
  }
  return absl::OkStatus();
}

void JobAdmission::Loop() {
  while (true) {
    std::vector<Request> batch;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !queue_.empty() || stopping_;
      };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) return;  // Stop answers what is left
      // One write for what waits now, bounded so that the first caller of a
      // burst is not kept waiting for the last.
      while (!queue_.empty() && batch.size() < 256) {
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    AdmitBatch(batch);
  }
}

void JobAdmission::AdmitBatch(std::vector<Request>& batch) {
  std::vector<absl::StatusOr<spec::JobSpec>> checked;
  checked.reserve(batch.size());
  for (const Request& r : batch) {
    checked.push_back(Check(r.spec_yaml, r.source_name, r.base_dir));
    if (!checked.back().ok() || !options_.check_owner) continue;
    if (absl::Status s = options_.check_owner(r.owner, *checked.back()); !s.ok()) {
      const std::string source = r.source_name.empty() ? "job spec" : r.source_name;
      checked.back() = absl::Status(s.code(), absl::StrCat(source, ": ", s.message()));
    }
  }
  std::vector<JobRecord> records;
  std::vector<size_t> admitted;  // indices into batch
  absl::Status acting = absl::OkStatus();
  {
    absl::MutexLock lock(&table_->mu());
    if (!table_->ActingLocked()) acting = table_->NotActingLocked();
    for (size_t i = 0; i < batch.size() && acting.ok(); ++i) {
      if (!checked[i].ok()) continue;
      const spec::JobSpec& spec = *checked[i];
      JobRecord& record = records.emplace_back();
      record.spec = spec;
      Job& job = record.job;
      job.set_id(table_->NewIdLocked(&record.sequence));
      job.set_name(spec.name);
      job.set_owner(batch[i].owner);
      job.set_state(JobState::PENDING);
      job.set_spec_yaml(batch[i].spec_yaml);
      job.set_resolved_spec_yaml(spec::ToYaml(spec));
      *job.mutable_layout() = LayoutToProto(spec::LayoutOf(spec));
      job.set_base_dir(options_.roots.data_roots.front());
      absl::Status paths = AssignCheckpointDirLocked(spec, job);
      if (paths.ok() && options_.roots.job_uids.has_value()) {
        // From the sequence number, which no other job ever gets.
        absl::StatusOr<uid_t> uid = confine::JobUid(*options_.roots.job_uids, record.sequence);
        if (uid.ok()) {
          job.set_run_uid(*uid);
        } else {
          paths = uid.status();
        }
      }
      if (!paths.ok()) {
        const std::string source =
            batch[i].source_name.empty() ? "job spec" : batch[i].source_name;
        checked[i] = absl::Status(paths.code(), absl::StrCat(source, ": ", paths.message()));
        records.pop_back();
        table_->GiveBackIdLocked();  // the id just taken is the newest
        continue;
      }
      job.set_created_unix_ms(absl::ToUnixMillis(absl::Now()));
      job.set_updated_unix_ms(job.created_unix_ms());
      job.mutable_last_progress()->set_total_steps(spec.train.steps);
      loom::v1::JobEvent* event = job.add_history();
      event->set_time_unix_ms(job.created_unix_ms());
      event->set_state(JobState::PENDING);
      event->set_message(absl::StrCat("accepted: ", spec.resources.world_size(),
                                      " ranks, layout dp=", job.layout().dp(), " tp=",
                                      job.layout().tp(), " pp=", job.layout().pp()));
      admitted.push_back(i);
    }
  }
  // Stored before any caller hears OK, by the persister (the one writer); a
  // job enters the table only once it is stored.
  absl::Status stored = acting;
  if (stored.ok() && !records.empty()) {
    std::vector<Job> jobs;
    jobs.reserve(records.size());
    for (const JobRecord& r : records) jobs.push_back(r.job);
    absl::Notification written;
    persister_->Insert(std::move(jobs), [&stored, &written](absl::Status status) {
      stored = std::move(status);
      written.Notify();
    });
    written.WaitForNotification();
  }
  std::vector<Job> replies;
  if (stored.ok() && !records.empty()) {
    absl::MutexLock lock(&table_->mu());
    for (JobRecord& record : records) {
      replies.push_back(table_->InsertLocked(std::move(record)).job);
    }
    lifecycle_->UpdateJobGaugesLocked();
    table_->RequestScheduleLocked();
  }
  // Callers are answered outside every lock: done completes an RPC.
  size_t next_admitted = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (!checked[i].ok()) {
      batch[i].done(checked[i].status());
    } else if (!stored.ok()) {
      batch[i].done(stored);
    } else {
      batch[i].done(std::move(replies[next_admitted++]));
    }
  }
}

}  // namespace loom::coordinator
