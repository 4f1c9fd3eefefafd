// The persister: the one thread that writes jobs to the job store. Changes
// queue here (the newest record of each job wins, its new steps with it) and
// leave in batches, one transaction each, never under the job table's mutex
// and never on a gRPC reaction. After each write it reports what the store
// now holds, or why it does not (the job table then releases what waited for
// the change, puts back a client's change that failed, and queues the rest
// again; job_table.h). A write that fails is retried with a backoff; one that
// is fenced (this coordinator no longer leads) stops the persister for good
// and is reported at once, so that the coordinator stops acting. New jobs
// (admission) and deletions queue here too, each with a callback for its
// answer.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/jobs/job_record.h"
#include "coordinator/jobs/job_store.h"
#include "coordinator/jobs/watch_hub.h"
#include "loom/v1/job.pb.h"

namespace loom::coordinator {

// The newest record of a job to store.
struct PersistRequest {
  loom::v1::Job job;  // without its placement, which joins it on the persister's thread
  std::shared_ptr<const Placement> placement;
  int64_t version = 0;  // JobRecord::version it was taken at
  UnstoredSteps steps;
};

// What became of a job's write.
struct WriteResult {
  std::string job_id;
  int64_t version = 0;
  int64_t steps_through = 0;
  // OK: stored. Else UNAVAILABLE naming the cause (IsFenced: the
  // coordinator no longer leads).
  absl::Status status;
  std::shared_ptr<const loom::v1::Job> job;  // as stored, without placement (when OK)
  std::shared_ptr<const Placement> placement;
};

struct JobPersisterOptions {
  // Backoff after a failed write, doubled per failure in a row.
  absl::Duration first_retry = absl::Milliseconds(50);
  absl::Duration max_retry = absl::Seconds(2);
};

class JobPersister {
 public:
  using WrittenCallback = std::function<void(std::vector<WriteResult>)>;
  using FencedCallback = std::function<void(const absl::Status&)>;
  using DoneCallback = std::function<void(absl::Status)>;

  explicit JobPersister(JobStore* store, JobPersisterOptions options = {});
  ~JobPersister();  // Stop()
  JobPersister(const JobPersister&) = delete;
  JobPersister& operator=(const JobPersister&) = delete;

  // Starts the thread. on_written runs on it after every write of records
  // (Put), on_fenced once when a write is fenced; neither under the
  // persister's lock.
  void Start(WrittenCallback on_written, FencedCallback on_fenced);

  // Queues a job's record; replaces one of the same job still queued (its
  // step chunks are kept, newer ones win).
  void Put(PersistRequest request);
  // New jobs, stored together or not at all; done gets OK or the failure.
  void Insert(std::vector<loom::v1::Job> jobs, DoneCallback done);
  // Removes jobs (after any record of theirs queued before); done as above.
  void Delete(std::vector<std::string> ids, DoneCallback done);

  // Writes what is queued (once more if the store fails), then stops; what
  // comes later fails UNAVAILABLE. Returns once the thread has ended.
  void Stop();
  // Returns once nothing is queued and no write is under way (tests).
  void WaitIdle();
  // Writes done so far, successful or not (tests).
  int64_t writes() const;
  bool fenced() const;

 private:
  struct Pending {
    std::vector<loom::v1::Job> jobs;
    DoneCallback done;
  };
  struct Removal {
    std::vector<std::string> ids;
    DoneCallback done;
  };
  void Loop();
  // The answer a caller gets for a failed write.
  static absl::Status Unavailable(const absl::Status& cause);

  JobStore* const store_;
  const JobPersisterOptions options_;
  WrittenCallback on_written_;
  FencedCallback on_fenced_;

  mutable absl::Mutex mu_;
  std::map<std::string, PersistRequest> puts_ ABSL_GUARDED_BY(mu_);
  std::deque<Pending> inserts_ ABSL_GUARDED_BY(mu_);
  std::deque<Removal> deletes_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  bool fenced_ ABSL_GUARDED_BY(mu_) = false;
  int64_t writes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration backoff_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  absl::Time retry_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::thread thread_;
};

}  // namespace loom::coordinator
