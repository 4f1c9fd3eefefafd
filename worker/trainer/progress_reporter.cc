#include "worker/trainer/progress_reporter.h"

#include <cstdio>

#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/security/credentials.h"

namespace loom::trainer {
namespace {

// Longer than keepalive needs to notice a dead connection (10 s + 5 s), and
// enough reports for that long at a fast step rate.
constexpr absl::Duration kResendWindow = absl::Seconds(30);
constexpr size_t kResendMax = 8192;

}  // namespace

ProgressReporter::ProgressReporter(const std::string& agent, std::string rank_token,
                                   std::string job_id, int32_t attempt, int32_t rank)
    // Local credentials: the agent's socket is on this host; the rank token
    // (not the connection) says which rank is calling.
    : channel_(grpc::CreateChannel(agent, grpc::experimental::LocalCredentials(UDS))),
      authorization_("Bearer " + std::move(rank_token)),
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

void ProgressReporter::Abandon() {
  absl::MutexLock lock(&mu_);
  queue_.clear();
  stopping_ = true;
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
    context.AddMetadata("authorization", authorization_);
    loom::v1::ReportProgressResponse response;
    auto writer = loom::v1::AgentService::NewStub(channel_)->ReportProgress(&context, &response);
    bool broken = false;
    // Reports written on this stream. A write that succeeded only reached the
    // local buffers: if the agent dies it may never have read them, so recent
    // ones are sent again on the next stream; the coordinator ignores steps it
    // already has.
    std::deque<std::pair<absl::Time, loom::v1::RankProgress>> sent;
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
      const absl::Time now = absl::Now();
      sent.emplace_back(now, std::move(next));
      while (sent.size() > kResendMax || sent.front().first < now - kResendWindow) {
        sent.pop_front();
      }
      absl::MutexLock lock(&mu_);
      queue_.pop_front();  // only after the write went through
    }
    if (!broken) {
      writer->WritesDone();
      writer->Finish();
      return;
    }
    const grpc::Status status = writer->Finish();
    // One line per outage (an agent that restarted does not know this rank:
    // it refuses the stream until it is gone, and the reports wait).
    if (backoff == absl::Milliseconds(100)) {
      std::fprintf(stderr, "loom-trainer: the progress stream to the agent ended (%s); retrying\n",
                   status.error_message().c_str());
    }
    // The agent went away; keep the queue (and what it may not have read)
    // and try again.
    {
      absl::MutexLock lock(&mu_);
      for (auto it = sent.rbegin(); it != sent.rend(); ++it) queue_.push_front(std::move(it->second));
    }
    // A channel whose connection failed can rest in IDLE and fail every new
    // stream at once without dialling again: ask it to connect, waiting at
    // most the backoff.
    const absl::Time until = absl::Now() + backoff;
    if (!channel_->WaitForConnected(absl::ToChronoTime(until))) {
      absl::SleepFor(until - absl::Now());
    }
    backoff = std::min(backoff * 2, absl::Seconds(2));
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
  }
}

}  // namespace loom::trainer
