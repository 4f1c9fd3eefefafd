// Job stores for the job manager's tests. FakeJobStore keeps jobs in memory
// and fails on demand, for unit tests of the parts (persister, table,
// lifecycle). GatedJobStore wraps any store (the real SQLite one in the
// durability tests) and holds every write at a gate the test opens, so that a
// test can see what answers while a write is under way. Both record which
// threads wrote.
#pragma once

#include <map>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/jobs/job_store.h"

namespace loom::coordinator::testing {

class FakeJobStore final : public JobStore {
 public:
  absl::Status Write(const JobWrite& write) override {
    absl::MutexLock lock(&mu_);
    writers_.insert(std::this_thread::get_id());
    ++writes_;
    if (failures_left_ > 0) {
      --failures_left_;
      return failure_;
    }
    for (const loom::v1::Job* job : write.jobs) jobs_[job->id()] = *job;
    for (const StepChunk& chunk : write.step_chunks) chunks_[chunk.job_id][chunk.index] = chunk.steps;
    for (const auto& [id, below] : write.keep_chunks_from) {
      auto& chunks = chunks_[id];
      chunks.erase(chunks.begin(), chunks.lower_bound(below));
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<loom::v1::Job>> LoadAll() override {
    absl::MutexLock lock(&mu_);
    std::vector<loom::v1::Job> jobs;
    for (const auto& [id, job] : jobs_) jobs.push_back(job);
    return jobs;
  }
  absl::StatusOr<std::map<std::string, StoredSteps>> LoadSteps() override {
    absl::MutexLock lock(&mu_);
    std::map<std::string, StoredSteps> steps;
    for (const auto& [id, chunks] : chunks_) {
      if (chunks.empty()) continue;
      StoredSteps& stored = steps[id];
      stored.first = chunks.begin()->first * kStepsPerChunk;
      for (const auto& [index, chunk] : chunks) {
        stored.steps.insert(stored.steps.end(), chunk.steps().begin(), chunk.steps().end());
      }
    }
    return steps;
  }
  absl::Status Delete(const std::vector<std::string>& ids) override {
    absl::MutexLock lock(&mu_);
    writers_.insert(std::this_thread::get_id());
    ++writes_;
    if (failures_left_ > 0) {
      --failures_left_;
      return failure_;
    }
    for (const std::string& id : ids) {
      jobs_.erase(id);
      chunks_.erase(id);
    }
    return absl::OkStatus();
  }
  absl::StatusOr<int64_t> MaxSequence() override { return 0; }

  // The next `count` writes fail with `status` and change nothing.
  void FailNext(int count, absl::Status status = absl::InternalError("disk on fire")) {
    absl::MutexLock lock(&mu_);
    failures_left_ = count;
    failure_ = std::move(status);
  }
  std::map<std::string, loom::v1::Job> jobs() {
    absl::MutexLock lock(&mu_);
    return jobs_;
  }
  int writes() {
    absl::MutexLock lock(&mu_);
    return writes_;
  }
  std::set<std::thread::id> writers() {
    absl::MutexLock lock(&mu_);
    return writers_;
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, loom::v1::Job> jobs_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::map<int64_t, loom::v1::JobSteps>> chunks_ ABSL_GUARDED_BY(mu_);
  int failures_left_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  int writes_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<std::thread::id> writers_ ABSL_GUARDED_BY(mu_);
};

// Holds writes (Write, Delete) at a gate while it is closed.
class GatedJobStore final : public JobStore {
 public:
  explicit GatedJobStore(std::unique_ptr<JobStore> inner) : inner_(std::move(inner)) {}

  absl::Status Write(const JobWrite& write) override {
    Pass();
    return inner_->Write(write);
  }
  absl::StatusOr<std::vector<loom::v1::Job>> LoadAll() override { return inner_->LoadAll(); }
  absl::StatusOr<std::map<std::string, StoredSteps>> LoadSteps() override {
    return inner_->LoadSteps();
  }
  absl::Status Delete(const std::vector<std::string>& ids) override {
    Pass();
    return inner_->Delete(ids);
  }
  absl::StatusOr<int64_t> MaxSequence() override { return inner_->MaxSequence(); }

  void Close() {
    absl::MutexLock lock(&mu_);
    open_ = false;
  }
  void Open() {
    absl::MutexLock lock(&mu_);
    open_ = true;
  }
  // Returns once a write waits at the (closed) gate.
  void AwaitWaiting() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](int* waiting) { return *waiting > 0; }, &waiting_));
  }
  std::set<std::thread::id> writers() {
    absl::MutexLock lock(&mu_);
    return writers_;
  }

 private:
  void Pass() {
    absl::MutexLock lock(&mu_);
    writers_.insert(std::this_thread::get_id());
    ++waiting_;
    mu_.Await(absl::Condition(&open_));
    --waiting_;
  }

  std::unique_ptr<JobStore> inner_;
  absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = true;
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<std::thread::id> writers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace loom::coordinator::testing
