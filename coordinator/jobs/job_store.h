// Where the coordinator keeps its jobs durably: every accepted job with its
// spec, state, attempt and history, and the steps its watchers replay, so that
// a coordinator restart (or, with the etcd store, a standby taking over) finds
// them again. Two implementations: SqliteJobStore (embedded, the default,
// under --state_dir) and ha::EtcdJobStore (--state=etcd://..., shared by
// several coordinators, every write fenced by the writer's leadership).
//
// Errors of a write: a write refused because the writer no longer leads is
// FencedError (IsFenced is true: the coordinator must stop acting at once);
// any other failure means the write did not happen, and the caller may retry.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "loom/v1/job.pb.h"

namespace loom::coordinator {

// Steps per stored chunk: a write rewrites only the chunks that gained steps.
inline constexpr int64_t kStepsPerChunk = 256;

// Chunk `index` of a job's steps: its steps number index * kStepsPerChunk
// onwards, in order, counted from the job's first step report.
struct StepChunk {
  std::string job_id;
  int64_t index = 0;
  loom::v1::JobSteps steps;
};

// A job's stored steps: steps[0] is number `first` of its series.
struct StoredSteps {
  int64_t first = 0;
  std::vector<loom::v1::JobProgress> steps;
};

// What one write stores, all or none.
struct JobWrite {
  // Inserted or replaced whole (the newest record of a job wins).
  std::vector<const loom::v1::Job*> jobs;
  // Inserted or replaced whole.
  std::vector<StepChunk> step_chunks;
  // Per job: its chunks below this index are removed (the series is bounded).
  std::map<std::string, int64_t> keep_chunks_from;
};

class JobStore {
 public:
  virtual ~JobStore() = default;

  // One transaction (etcd: more than one when it exceeds a transaction's
  // limits, each all or none); durable when it returns OK.
  virtual absl::Status Write(const JobWrite& write) = 0;
  // Every job, in the order of their id sequence numbers.
  virtual absl::StatusOr<std::vector<loom::v1::Job>> LoadAll() = 0;
  // Every job's stored steps, oldest first.
  virtual absl::StatusOr<std::map<std::string, StoredSteps>> LoadSteps() = 0;
  // Removes jobs and their steps at once; their ids are still counted by
  // MaxSequence, so never given again.
  virtual absl::Status Delete(const std::vector<std::string>& ids) = 0;
  // The largest numeric job id suffix seen, so new ids continue after a restart.
  virtual absl::StatusOr<int64_t> MaxSequence() = 0;

  // Write of jobs alone.
  absl::Status PutAll(const std::vector<const loom::v1::Job*>& jobs);
  absl::Status Put(const loom::v1::Job& job);
};

// The sequence number of a job id ("job-3f9a1c-000042" -> 42).
int64_t JobIdSequence(const std::string& id);

// A write refused because its writer's term of leadership ended (etcd's
// fence did not hold): FAILED_PRECONDITION, marked so that IsFenced knows it.
absl::Status FencedError(const std::string& message);
bool IsFenced(const absl::Status& status);

}  // namespace loom::coordinator
