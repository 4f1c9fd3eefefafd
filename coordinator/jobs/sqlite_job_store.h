// The embedded JobStore: durable job records in SQLite (WAL) under
// --state_dir. Each job is one row holding the serialized loom.v1.Job; the
// columns beside it are for inspection with the sqlite3 shell. A job's steps
// are rows of the steps table, one per chunk (loom.v1.JobSteps).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/jobs/job_store.h"

struct sqlite3;

namespace loom::coordinator {

struct SqliteJobStoreOptions {
  // How long a write waits for a lock another connection holds (the sqlite3
  // shell, a backup) before it fails.
  absl::Duration busy_timeout = absl::Seconds(5);
};

class SqliteJobStore final : public JobStore {
 public:
  // Opens (creating if needed) <state_dir>/loom.db.
  static absl::StatusOr<std::unique_ptr<SqliteJobStore>> Open(
      const std::string& state_dir, const SqliteJobStoreOptions& options = {});
  ~SqliteJobStore() override;

  // One SQLite transaction, one sync to disk.
  absl::Status Write(const JobWrite& write) override;
  absl::StatusOr<std::vector<loom::v1::Job>> LoadAll() override;
  absl::StatusOr<std::map<std::string, StoredSteps>> LoadSteps() override;
  absl::Status Delete(const std::vector<std::string>& ids) override;
  absl::StatusOr<int64_t> MaxSequence() override;

 private:
  explicit SqliteJobStore(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  absl::Status Exec(const char* sql);
  absl::Status PutLocked(const loom::v1::Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status PutChunkLocked(const StepChunk& chunk) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status DropChunksLocked(const std::string& job_id, int64_t below)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  sqlite3* db_;
  std::string path_;
};

}  // namespace loom::coordinator
