// Durable job records in SQLite (WAL): every accepted job with its spec,
// state, attempt and history survives a coordinator restart. Each job is one
// row holding the serialized loom.v1.Job; the columns beside it are for
// inspection with the sqlite3 shell.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "loom/v1/job.pb.h"

struct sqlite3;

namespace loom::coordinator {

class JobStore {
 public:
  // Opens (creating if needed) <state_dir>/loom.db.
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(const std::string& state_dir);
  ~JobStore();

  // Insert or replace; durable when it returns OK.
  absl::Status Put(const loom::v1::Job& job);
  // Put of several jobs in one transaction (one sync to disk): all or none.
  absl::Status PutAll(const std::vector<const loom::v1::Job*>& jobs);
  absl::StatusOr<std::vector<loom::v1::Job>> LoadAll();
  // Removes jobs in one transaction; their ids are still counted by
  // MaxSequence, so never given again.
  absl::Status Delete(const std::vector<std::string>& ids);
  // The largest numeric job id suffix seen, so new ids continue after a restart.
  absl::StatusOr<int64_t> MaxSequence();

 private:
  explicit JobStore(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  absl::Status Exec(const char* sql);
  absl::Status PutLocked(const loom::v1::Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  sqlite3* db_;
  std::string path_;
};

}  // namespace loom::coordinator
