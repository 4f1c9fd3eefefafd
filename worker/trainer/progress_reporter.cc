#include "worker/trainer/progress_reporter.h"

#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"

namespace loom::trainer {

ProgressReporter::ProgressReporter(std::shared_ptr<grpc::Channel> channel, std::string job_id,
                                   int32_t attempt, int32_t rank)
    : stub_(loom::v1::RankService::NewStub(std::move(channel))),
      job_id_(std::move(job_id)),
      attempt_(attempt),
      rank_(rank),
      thread_([this] { Run(); }) {}

ProgressReporter::~ProgressReporter() {
  Flush(absl::Seconds(5));
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void ProgressReporter::Report(loom::v1::RankProgress progress) {
  progress.set_job_id(job_id_);
  progress.set_attempt(attempt_);
  progress.set_rank(rank_);
  const absl::Time now = absl::Now();
  progress.set_time_unix_ms(absl::ToUnixMillis(now));
  progress.set_time_unix_us(absl::ToUnixMicros(now));
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(progress));
}

bool ProgressReporter::Flush(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto drained = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return queue_.empty(); };
  return mu_.AwaitWithTimeout(absl::Condition(&drained), timeout);
}

void ProgressReporter::Run() {
  absl::Duration backoff = absl::Milliseconds(100);
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (stopping_ && queue_.empty()) return;
    }
    grpc::ClientContext context;
    loom::v1::ReportProgressResponse response;
    auto writer = stub_->ReportProgress(&context, &response);
    bool broken = false;
    while (!broken) {
      loom::v1::RankProgress next;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stopping_ || !queue_.empty();
        };
        mu_.Await(absl::Condition(&ready));
        if (queue_.empty()) break;  // stopping with nothing left
        next = queue_.front();
      }
      if (!writer->Write(next)) {
        broken = true;
        break;
      }
      backoff = absl::Milliseconds(100);
      absl::MutexLock lock(&mu_);
      queue_.pop_front();  // only after the write went through
    }
    if (!broken) {
      writer->WritesDone();
      writer->Finish();
      return;
    }
    writer->Finish();
    // The coordinator went away; keep the queue and try again.
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(2));
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
  }
}

}  // namespace loom::trainer
