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

absl::StatusOr<std::unique_ptr<SqliteJobStore>> SqliteJobStore::Open(
    const std::string& state_dir, const SqliteJobStoreOptions& options) {
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
  sqlite3_busy_timeout(db, static_cast<int>(absl::ToInt64Milliseconds(options.busy_timeout)));
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
                          " value INTEGER NOT NULL);",
                          // The steps watchers replay, a chunk of them per row.
                          "CREATE TABLE IF NOT EXISTS steps (job_id TEXT NOT NULL,"
                          " chunk INTEGER NOT NULL, steps BLOB NOT NULL,"
                          " PRIMARY KEY (job_id, chunk));"}) {
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

absl::Status SqliteJobStore::Write(const JobWrite& write) {
  absl::MutexLock lock(&mu_);
  // IMMEDIATE: the write lock is taken now, so a database another connection
  // holds fails here, before anything is written.
  if (absl::Status s = Exec("BEGIN IMMEDIATE;"); !s.ok()) return s;
  auto fail = [this](absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Exec("ROLLBACK;").IgnoreError();
    return status;
  };
  for (const loom::v1::Job* job : write.jobs) {
    if (absl::Status s = PutLocked(*job); !s.ok()) return fail(s);
  }
  for (const StepChunk& chunk : write.step_chunks) {
    if (absl::Status s = PutChunkLocked(chunk); !s.ok()) return fail(s);
  }
  for (const auto& [job_id, below] : write.keep_chunks_from) {
    if (absl::Status s = DropChunksLocked(job_id, below); !s.ok()) return fail(s);
  }
  if (absl::Status s = Exec("COMMIT;"); !s.ok()) return fail(s);
  return absl::OkStatus();
}

absl::Status SqliteJobStore::PutChunkLocked(const StepChunk& chunk) {
  const std::string blob = chunk.steps.SerializeAsString();
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db_, "INSERT OR REPLACE INTO steps (job_id, chunk, steps) VALUES (?, ?, ?);",
                         -1, &stmt, nullptr) != SQLITE_OK) {
    return SqlError(db_, path_, "prepare steps insert");
  }
  sqlite3_bind_text(stmt, 1, chunk.job_id.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_int64(stmt, 2, chunk.index);
  sqlite3_bind_blob(stmt, 3, blob.data(), static_cast<int>(blob.size()), SQLITE_TRANSIENT);
  const int rc = sqlite3_step(stmt);
  sqlite3_finalize(stmt);
  if (rc != SQLITE_DONE) {
    return SqlError(db_, path_, absl::StrCat("store steps of job ", chunk.job_id));
  }
  return absl::OkStatus();
}

absl::Status SqliteJobStore::DropChunksLocked(const std::string& job_id, int64_t below) {
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db_, "DELETE FROM steps WHERE job_id = ? AND chunk < ?;", -1, &stmt,
                         nullptr) != SQLITE_OK) {
    return SqlError(db_, path_, "prepare steps delete");
  }
  sqlite3_bind_text(stmt, 1, job_id.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_int64(stmt, 2, below);
  const int rc = sqlite3_step(stmt);
  sqlite3_finalize(stmt);
  if (rc != SQLITE_DONE) return SqlError(db_, path_, absl::StrCat("drop steps of job ", job_id));
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, StoredSteps>> SqliteJobStore::LoadSteps() {
  absl::MutexLock lock(&mu_);
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db_, "SELECT job_id, chunk, steps FROM steps ORDER BY job_id, chunk;",
                         -1, &stmt, nullptr) != SQLITE_OK) {
    return SqlError(db_, path_, "prepare steps select");
  }
  std::map<std::string, StoredSteps> steps;
  int rc;
  while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    const std::string id = reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0));
    loom::v1::JobSteps chunk;
    if (!chunk.ParseFromArray(sqlite3_column_blob(stmt, 2), sqlite3_column_bytes(stmt, 2))) {
      sqlite3_finalize(stmt);
      return absl::DataLossError(
          absl::StrCat("job store ", path_, ": the steps of job ", id, " are unreadable"));
    }
    auto [it, first] = steps.try_emplace(id);
    if (first) it->second.first = sqlite3_column_int64(stmt, 1) * kStepsPerChunk;
    for (loom::v1::JobProgress& step : *chunk.mutable_steps()) {
      it->second.steps.push_back(std::move(step));
    }
  }
  sqlite3_finalize(stmt);
  if (rc != SQLITE_DONE) return SqlError(db_, path_, "read steps");
  return steps;
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
  if (absl::Status s = Exec("BEGIN IMMEDIATE;"); !s.ok()) return s;
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
  for (const char* sql : {"DELETE FROM jobs WHERE id = ?;", "DELETE FROM steps WHERE job_id = ?;"}) {
    sqlite3_stmt* stmt = nullptr;
    if (sqlite3_prepare_v2(db_, sql, -1, &stmt, nullptr) != SQLITE_OK) {
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
  }
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
