// Admission: SubmitJob requests are checked (size, parse, rules, limits, the
// planner's layout, memory, paths) on the admission thread, never on a gRPC
// reaction and never under the job table's mutex, and stored before anyone
// hears OK. Submissions that wait together are checked one by one and stored
// in one write (one fsync for the batch); a job enters the table only once
// it is stored, and a failed write reaches every caller of the batch as
// UNAVAILABLE (their ids stay unused). The queue is bounded: beyond it a
// submission is refused at once with RESOURCE_EXHAUSTED.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/spec/job_spec.h"
#include "coordinator/jobs/job_lifecycle.h"
#include "coordinator/jobs/job_paths.h"
#include "coordinator/jobs/job_persister.h"
#include "coordinator/jobs/job_table.h"
#include "loom/v1/job.pb.h"

namespace loom::coordinator {

// Fills the axes a spec leaves to the planner and checks that the engine can
// run the result, or says why not (planner::ResolveLayout, planner/job_planner.h).
using LayoutResolver = std::function<absl::Status(spec::JobSpec&)>;

struct AdmissionOptions {
  // The YAML's size and the most ranks one job may ask for (docs/limits.md).
  int64_t max_spec_bytes = 256 * 1024;
  int64_t max_job_ranks = 16384;
  // Submissions waiting for the admission thread beyond this are refused.
  int64_t max_queued_submissions = 4096;
  // The transport's bound on one rank's launch: a job sure to be above it
  // from its numbers alone is refused here (assignment_builder.h).
  int64_t max_launch_bytes = 16 * 1024 * 1024;
  FileRoots roots;  // with its defaults filled in
  // What a submission's owner may ask for (their scheduling.priority cap,
  // quota_book.h); empty: anything the rules allow.
  std::function<absl::Status(const std::string& owner, const spec::JobSpec& spec)> check_owner;
};

class JobAdmission {
 public:
  using SubmitCallback = std::function<void(absl::StatusOr<loom::v1::Job>)>;

  JobAdmission(AdmissionOptions options, LayoutResolver resolver, JobTable* table,
               JobPersister* persister, JobLifecycle* lifecycle);
  ~JobAdmission();  // Stop()
  JobAdmission(const JobAdmission&) = delete;
  JobAdmission& operator=(const JobAdmission&) = delete;

  void Start();
  // Answers what waits with UNAVAILABLE (the client retries with the next
  // coordinator) and ends the thread.
  void Stop();

  // Queues a submission; done runs on the admission thread (or at once when
  // refused), without any lock held. owner: the caller's identity (Job.owner).
  // base_dir (the client's spec directory) is not trusted and not used.
  void SubmitAsync(std::string spec_yaml, std::string source_name, std::string base_dir,
                   std::string owner, SubmitCallback done);

  // The checks of a submission that need no state (size, parse, rules,
  // limits, layout, memory, paths); the spec with its layout resolved.
  absl::StatusOr<spec::JobSpec> Check(const std::string& spec_yaml, const std::string& source_name,
                                      const std::string& base_dir) const;

 private:
  struct Request {
    std::string spec_yaml;
    std::string source_name;
    std::string base_dir;
    std::string owner;
    SubmitCallback done;
  };
  void Loop();
  void AdmitBatch(std::vector<Request>& batch);
  // The job's checkpoint directory from its owner and id, and the check that
  // checkpoint.resume_from names one of the owner's jobs.
  absl::Status AssignCheckpointDirLocked(const spec::JobSpec& spec, loom::v1::Job& job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());

  const AdmissionOptions options_;
  const LayoutResolver resolver_;
  JobTable* const table_;
  JobPersister* const persister_;
  JobLifecycle* const lifecycle_;

  absl::Mutex mu_;
  std::deque<Request> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace loom::coordinator
