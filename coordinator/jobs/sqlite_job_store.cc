#include "coordinator/jobs/sqlite_job_store.h"

#include <sqlite3.h>

#include <filesystem>

#include "absl/strings/str_cat.h"

namespace loom::coordinator {
namespace {

absl::Status SqlError(sqlite3* db, const std::string& path, const std::string& what) {
  return absl::InternalError(absl::StrCat("job store ", path, ": ", what, ": ", sqlite3_errmsg(db)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<SqliteJobStore>> SqliteJobStore::Open(const std::string& state_dir) {
  std::error_code ec;
  std::filesystem::create_directories(state_dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("--state_dir=", state_dir, ": cannot create the directory: ", ec.message()));
  }
  const std::string path = (std::filesystem::path(state_dir) / "loom.db").string();
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE |
                                             SQLITE_OPEN_FULLMUTEX,
                      nullptr) != SQLITE_OK) {
    absl::Status status = SqlError(db, path, "cannot open");
    sqlite3_close(db);
    return status;
  }
  std::unique_ptr<SqliteJobStore> store(new SqliteJobStore(db, path));
  sqlite3_busy_timeout(db, 5000);
  // WAL with synchronous=FULL: a committed Put survives power loss, and
  // readers (the sqlite3 shell) never block the coordinator.
  for (const char* sql : {"PRAGMA journal_mode=WAL;", "PRAGMA synchronous=FULL;",
                          "CREATE TABLE IF NOT EXISTS jobs ("
                          " id TEXT PRIMARY KEY, seq INTEGER NOT NULL, name TEXT NOT NULL,"
                          " state TEXT NOT NULL, attempt INTEGER NOT NULL,"
                          " updated_unix_ms INTEGER NOT NULL, job BLOB NOT NULL);",
                          // The largest sequence ever used, so a deleted job's id is never
                          // given again.
                          "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY,"
                          " value INTEGER NOT NULL);"}) {
    if (absl::Status s = store->Exec(sql); !s.ok()) return s;
  }
  return store;
}

SqliteJobStore::~SqliteJobStore() { sqlite3_close(db_); }

absl::Status SqliteJobStore::Exec(const char* sql) {
  char* message = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &message) != SQLITE_OK) {
    std::string text = message ? message : "unknown error";
    sqlite3_free(message);
    return absl::InternalError(absl::StrCat("job store ", path_, ": ", text));
  }
  return absl::OkStatus();
}

absl::Status SqliteJobStore::Put(const loom::v1::Job& job) {
  absl::MutexLock lock(&mu_);
  return PutLocked(job);
}

absl::Status SqliteJobStore::PutAll(const std::vector<const loom::v1::Job*>& jobs) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Exec("BEGIN;"); !s.ok()) return s;
  for (const loom::v1::Job* job : jobs) {
    if (absl::Status s = PutLocked(*job); !s.ok()) {
      Exec("ROLLBACK;").IgnoreError();
      return s;
    }
  }
  if (absl::Status s = Exec("COMMIT;"); !s.ok()) {
    Exec("ROLLBACK;").IgnoreError();
    return s;
  }
  return absl::OkStatus();
}

absl::Status SqliteJobStore::PutLocked(const loom::v1::Job& job) {
  const std::string blob = job.SerializeAsString();
  const int64_t seq = JobIdSequence(job.id());
  sqlite3_stmt* stmt = nullptr;
  const char* sql =
      "INSERT OR REPLACE INTO jobs (id, seq, name, state, attempt, updated_unix_ms, job)"
      " VALUES (?, ?, ?, ?, ?, ?, ?);";
  if (sqlite3_prepare_v2(db_, sql, -1, &stmt, nullptr) != SQLITE_OK) {
    return SqlError(db_, path_, "prepare insert");
  }
  sqlite3_bind_text(stmt, 1, job.id().c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_int64(stmt, 2, seq);
  sqlite3_bind_text(stmt, 3, job.name().c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(stmt, 4, loom::v1::JobState_Name(job.state()).c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_int(stmt, 5, job.attempt());
  sqlite3_bind_int64(stmt, 6, job.updated_unix_ms());
  sqlite3_bind_blob(stmt, 7, blob.data(), static_cast<int>(blob.size()), SQLITE_TRANSIENT);
  const int rc = sqlite3_step(stmt);
  sqlite3_finalize(stmt);
  if (rc != SQLITE_DONE) return SqlError(db_, path_, absl::StrCat("store job ", job.id()));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<loom::v1::Job>> SqliteJobStore::LoadAll() {
  absl::MutexLock lock(&mu_);
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db_, "SELECT id, job FROM jobs ORDER BY seq;", -1, &stmt, nullptr) !=
      SQLITE_OK) {
    return SqlError(db_, path_, "prepare select");
  }
  std::vector<loom::v1::Job> jobs;
  int rc;
  while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    const void* data = sqlite3_column_blob(stmt, 1);
    const int size = sqlite3_column_bytes(stmt, 1);
    loom::v1::Job job;
    if (!job.ParseFromArray(data, size)) {
      const std::string id = reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0));
      sqlite3_finalize(stmt);
      return absl::DataLossError(absl::StrCat("job store ", path_, ": job ", id,
                                              " has an unreadable record"));
    }
    jobs.push_back(std::move(job));
  }
  sqlite3_finalize(stmt);
  if (rc != SQLITE_DONE) return SqlError(db_, path_, "read jobs");
  return jobs;
}

absl::Status SqliteJobStore::Delete(const std::vector<std::string>& ids) {
  absl::MutexLock lock(&mu_);
  if (ids.empty()) return absl::OkStatus();
  if (absl::Status s = Exec("BEGIN;"); !s.ok()) return s;
  auto fail = [this](absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Exec("ROLLBACK;").IgnoreError();
    return status;
  };
  if (absl::Status s = Exec(
          "INSERT INTO meta (key, value) SELECT 'max_seq', COALESCE(MAX(seq), 0) FROM jobs WHERE true"
          " ON CONFLICT(key) DO UPDATE SET value = MAX(value, excluded.value);");
      !s.ok()) {
    return fail(s);
  }
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db_, "DELETE FROM jobs WHERE id = ?;", -1, &stmt, nullptr) != SQLITE_OK) {
    return fail(SqlError(db_, path_, "prepare delete"));
  }
  for (const std::string& id : ids) {
    sqlite3_bind_text(stmt, 1, id.c_str(), -1, SQLITE_TRANSIENT);
    if (sqlite3_step(stmt) != SQLITE_DONE) {
      absl::Status status = SqlError(db_, path_, absl::StrCat("delete job ", id));
      sqlite3_finalize(stmt);
      return fail(status);
    }
    sqlite3_reset(stmt);
  }
  sqlite3_finalize(stmt);
  if (absl::Status s = Exec("COMMIT;"); !s.ok()) return fail(s);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> SqliteJobStore::MaxSequence() {
  absl::MutexLock lock(&mu_);
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db_,
                         "SELECT MAX(COALESCE((SELECT MAX(seq) FROM jobs), 0),"
                         " COALESCE((SELECT value FROM meta WHERE key = 'max_seq'), 0));",
                         -1, &stmt, nullptr) != SQLITE_OK) {
    return SqlError(db_, path_, "prepare max");
  }
  int64_t max = 0;
  if (sqlite3_step(stmt) == SQLITE_ROW) max = sqlite3_column_int64(stmt, 0);
  sqlite3_finalize(stmt);
  return max;
}

}  // namespace loom::coordinator
