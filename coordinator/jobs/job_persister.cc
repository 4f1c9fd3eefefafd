#include "coordinator/jobs/job_persister.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace loom::coordinator {

JobPersister::JobPersister(JobStore* store, JobPersisterOptions options)
    : store_(store), options_(options) {}

JobPersister::~JobPersister() { Stop(); }

void JobPersister::Start(WrittenCallback on_written, FencedCallback on_fenced) {
  on_written_ = std::move(on_written);
  on_fenced_ = std::move(on_fenced);
  thread_ = std::thread([this] { Loop(); });
}

absl::Status JobPersister::Unavailable(const absl::Status& cause) {
  if (IsFenced(cause)) {
    // Clients follow the leader on UNAVAILABLE; the mark stays for IsFenced.
    absl::Status status = absl::UnavailableError(absl::StrCat(
        "this coordinator no longer leads, nothing was changed; retry (", cause.message(), ")"));
    cause.ForEachPayload([&status](absl::string_view url, const absl::Cord& payload) {
      status.SetPayload(url, payload);
    });
    return status;
  }
  return absl::UnavailableError(absl::StrCat(
      "the job store could not save the change, nothing was changed; retry (", cause.message(),
      ")"));
}

void JobPersister::Put(PersistRequest request) {
  absl::MutexLock lock(&mu_);
  if (stopped_ || fenced_) return;
  auto [it, inserted] = puts_.try_emplace(request.job.id());
  if (inserted) {
    it->second = std::move(request);
    return;
  }
  // Chunks queued earlier that the newer request does not carry again (a
  // chunk it carries holds at least as many steps) are still to be written.
  std::vector<StepChunk> chunks = std::move(it->second.steps.chunks);
  for (StepChunk& chunk : request.steps.chunks) {
    auto same = std::find_if(chunks.begin(), chunks.end(),
                             [&chunk](const StepChunk& c) { return c.index == chunk.index; });
    if (same != chunks.end()) {
      *same = std::move(chunk);
    } else {
      chunks.push_back(std::move(chunk));
    }
  }
  request.steps.chunks = std::move(chunks);
  it->second = std::move(request);
}

void JobPersister::Insert(std::vector<loom::v1::Job> jobs, DoneCallback done) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopped_ && !fenced_) {
      inserts_.push_back({std::move(jobs), std::move(done)});
      return;
    }
  }
  done(absl::UnavailableError("the coordinator is stopping; retry"));
}

void JobPersister::Delete(std::vector<std::string> ids, DoneCallback done) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopped_ && !fenced_) {
      deletes_.push_back({std::move(ids), std::move(done)});
      return;
    }
  }
  done(absl::UnavailableError("the coordinator is stopping; retry"));
}

void JobPersister::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
  std::deque<Pending> inserts;
  std::deque<Removal> deletes;
  {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
    inserts.swap(inserts_);
    deletes.swap(deletes_);
    puts_.clear();
  }
  // Only when the thread never ran (or gave up) is anything left here.
  for (Pending& p : inserts) p.done(absl::UnavailableError("the coordinator is stopping; retry"));
  for (Removal& r : deletes) r.done(absl::UnavailableError("the coordinator is stopping; retry"));
}

void JobPersister::WaitIdle() {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopped_ || fenced_ ||
           (puts_.empty() && inserts_.empty() && deletes_.empty() && !writing_);
  };
  mu_.Await(absl::Condition(&idle));
}

int64_t JobPersister::writes() const {
  absl::MutexLock lock(&mu_);
  return writes_;
}

bool JobPersister::fenced() const {
  absl::MutexLock lock(&mu_);
  return fenced_;
}

void JobPersister::Loop() {
  bool failed_while_stopping = false;
  while (true) {
    std::map<std::string, PersistRequest> puts;
    std::deque<Pending> inserts;
    std::deque<Removal> deletes;
    {
      absl::ReleasableMutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || fenced_ || !puts_.empty() || !inserts_.empty() || !deletes_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      // After a failure, wait out the backoff (a stop does not wait).
      if (!stopping_ && retry_at_ > absl::Now()) {
        mu_.AwaitWithDeadline(absl::Condition(&stopping_), retry_at_);
      }
      const bool empty = puts_.empty() && inserts_.empty() && deletes_.empty();
      if (fenced_ || (stopping_ && (empty || failed_while_stopping))) {
        // What still waits is answered by Stop, or now when fenced (no
        // write will come for it).
        if (fenced_) {
          inserts.swap(inserts_);
          deletes.swap(deletes_);
          puts_.clear();
        }
        lock.Release();
        const absl::Status refused = absl::UnavailableError("this coordinator no longer leads; retry");
        for (Pending& p : inserts) p.done(refused);
        for (Removal& r : deletes) r.done(refused);
        return;
      }
      puts.swap(puts_);
      inserts.swap(inserts_);
      deletes.swap(deletes_);
      writing_ = true;
    }
    // The stored record is whole: each placement joins its job here, off
    // every lock, and leaves it again for what readers are shown.
    std::vector<loom::v1::Job> whole;
    whole.reserve(puts.size());
    JobWrite write;
    for (auto& [id, request] : puts) {
      loom::v1::Job& job = whole.emplace_back(std::move(request.job));
      if (request.placement != nullptr) *job.mutable_placement() = *request.placement;
      for (StepChunk& chunk : request.steps.chunks) write.step_chunks.push_back(std::move(chunk));
      if (request.steps.keep_chunks_from > 0) {
        write.keep_chunks_from[id] = request.steps.keep_chunks_from;
      }
    }
    for (const loom::v1::Job& job : whole) write.jobs.push_back(&job);
    for (const Pending& p : inserts) {
      for (const loom::v1::Job& job : p.jobs) write.jobs.push_back(&job);
    }
    absl::Status status = absl::OkStatus();
    if (!write.jobs.empty() || !write.step_chunks.empty() || !write.keep_chunks_from.empty()) {
      status = store_->Write(write);
    }
    // Deletions follow the records queued before them, and only if those
    // were stored (else a job could come back after its delete).
    std::vector<absl::Status> removed;
    absl::Status failure = status;  // the first failure of this round
    for (const Removal& r : deletes) {
      removed.push_back(failure.ok() ? store_->Delete(r.ids) : failure);
      if (failure.ok()) failure = removed.back();
    }
    const bool fenced = IsFenced(failure);
    if (!failure.ok()) {
      std::fprintf(stderr, "job store: a write failed (%s)%s\n",
                   std::string(failure.message()).c_str(),
                   fenced ? "; this coordinator no longer leads" : "; it will be retried");
    }
    // Fenced: reported first, so that the coordinator stops acting before
    // anyone hears of the failure; the persister writes nothing more.
    if (fenced && on_fenced_) on_fenced_(Unavailable(failure));
    std::vector<WriteResult> results;
    results.reserve(whole.size());
    size_t next = 0;
    for (auto& [id, request] : puts) {
      WriteResult& result = results.emplace_back();
      result.job_id = id;
      result.version = request.version;
      result.steps_through = request.steps.through;
      loom::v1::Job& job = whole[next++];
      if (status.ok()) {
        job.clear_placement();  // readers get it from the placement itself
        result.job = std::make_shared<const loom::v1::Job>(std::move(job));
        result.placement = std::move(request.placement);
      } else {
        result.status = Unavailable(status);
      }
    }
    if (!results.empty() && on_written_) on_written_(std::move(results));
    const absl::Status answer = status.ok() ? status : Unavailable(status);
    for (Pending& p : inserts) p.done(answer);
    for (size_t i = 0; i < deletes.size(); ++i) {
      deletes[i].done(removed[i].ok() ? removed[i] : Unavailable(removed[i]));
    }
    absl::MutexLock lock(&mu_);
    writing_ = false;
    ++writes_;
    if (fenced) fenced_ = true;
    if (failure.ok()) {
      backoff_ = absl::ZeroDuration();
      retry_at_ = absl::InfinitePast();
    } else {
      backoff_ = std::min(options_.max_retry, backoff_ == absl::ZeroDuration()
                                                  ? options_.first_retry
                                                  : 2 * backoff_);
      retry_at_ = absl::Now() + backoff_;
      if (stopping_) failed_while_stopping = true;
    }
  }
}

}  // namespace loom::coordinator
