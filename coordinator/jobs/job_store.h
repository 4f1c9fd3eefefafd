// Where the coordinator keeps its jobs durably: every accepted job with its
// spec, state, attempt and history, so that a coordinator restart (or, with
// the etcd store, a standby taking over) finds them again. Two
// implementations: SqliteJobStore (embedded, the default, under --state_dir)
// and ha::EtcdJobStore (--state=etcd://..., shared by several coordinators,
// every write fenced by the writer's leadership).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "loom/v1/job.pb.h"

namespace loom::coordinator {

class JobStore {
 public:
  virtual ~JobStore() = default;

  // Insert or replace; durable when it returns OK.
  virtual absl::Status Put(const loom::v1::Job& job) = 0;
  // Put of several jobs at once (one sync to disk): all or none.
  virtual absl::Status PutAll(const std::vector<const loom::v1::Job*>& jobs) = 0;
  // Every job, in the order of their id sequence numbers.
  virtual absl::StatusOr<std::vector<loom::v1::Job>> LoadAll() = 0;
  // Removes jobs at once; their ids are still counted by MaxSequence, so never
  // given again.
  virtual absl::Status Delete(const std::vector<std::string>& ids) = 0;
  // The largest numeric job id suffix seen, so new ids continue after a restart.
  virtual absl::StatusOr<int64_t> MaxSequence() = 0;
};

// The sequence number of a job id ("job-3f9a1c-000042" -> 42).
int64_t JobIdSequence(const std::string& id);

}  // namespace loom::coordinator
