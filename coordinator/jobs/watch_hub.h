// The watch hub: who watches which job, and the record of every job's steps
// that a watch replays. A WatchJob stream subscribes with the job's stored
// snapshot and the steps so far (its backlog), then receives each update the
// job manager pushes until the job ends. The steps are bounded
// (kBacklogSteps per job) and stored with the job (in chunks of
// kStepsPerChunk, job_store.h), so a watch after a coordinator restart still
// replays the whole run. No lock of its own: every method runs under the job
// table's mutex, which is what orders a subscription against the updates.
// Sinks must not block (they queue).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/jobs/job_store.h"
#include "loom/v1/job.pb.h"

namespace loom::coordinator {

// Receives a watched job's updates; Push must not call back into the manager.
class WatchSink {
 public:
  virtual ~WatchSink() = default;
  // last: the job has ended and this is the final update.
  virtual void Push(const loom::v1::WatchJobResponse& update, bool last) = 0;
};

// The steps of a job the store does not hold yet, as chunks to write.
struct UnstoredSteps {
  std::vector<StepChunk> chunks;
  int64_t keep_chunks_from = 0;  // chunks below are outside the bound
  int64_t through = 0;           // the job's step count once these are stored
};

class WatchHub {
 public:
  // Step reports each job keeps for watchers that join late.
  static constexpr size_t kBacklogSteps = 10000;

  explicit WatchHub(int64_t max_watchers_per_job = 64, size_t backlog_steps = kBacklogSteps)
      : max_watchers_(max_watchers_per_job), backlog_steps_(backlog_steps) {}

  // What watchers receive of a job: no specs or namespace, which grow with
  // the job or are secret, and which no watcher reads.
  static loom::v1::Job WatchView(const loom::v1::Job& job);

  // Subscribes: the sink receives snapshot (with the backlog added) at once,
  // as the last update when the job has ended (then no handle: 0).
  // RESOURCE_EXHAUSTED past max_watchers_per_job.
  absl::StatusOr<int64_t> Subscribe(const std::string& job_id, loom::v1::WatchJobResponse snapshot,
                                    bool ended, std::shared_ptr<WatchSink> sink);
  void Unsubscribe(const std::string& job_id, int64_t handle);
  // To every watcher of the job; last: the job ended, its watchers are let go.
  void Push(const std::string& job_id, const loom::v1::WatchJobResponse& update, bool last);
  size_t Watchers(const std::string& job_id) const;

  // A step of the job's progress (oldest dropped past the bound).
  void AddStep(const std::string& job_id, const loom::v1::JobProgress& step);
  const std::deque<loom::v1::JobProgress>* Steps(const std::string& job_id) const;
  // The chunks holding steps not yet stored (each chunk whole, with the
  // steps before them that it holds).
  UnstoredSteps Unstored(const std::string& job_id) const;
  // The store holds the job's steps up to `through` (UnstoredSteps::through).
  void StepsStored(const std::string& job_id, int64_t through);
  // The steps the store held when this coordinator started: stored already.
  void Restore(const std::string& job_id, StoredSteps steps);
  // The job is gone: its watchers and steps.
  void Forget(const std::string& job_id);

 private:
  struct Entry {
    std::map<int64_t, std::shared_ptr<WatchSink>> watchers;
    std::deque<loom::v1::JobProgress> steps;  // the newest, at most backlog_steps_
    int64_t first = 0;   // the number of steps.front() in the job's series (from 0)
    int64_t stored = 0;  // steps 0..stored-1 are in the store
  };
  const int64_t max_watchers_;
  const size_t backlog_steps_;
  std::map<std::string, Entry> jobs_;
  int64_t next_handle_ = 1;
};

}  // namespace loom::coordinator
