#include "coordinator/service/logs_stream.h"

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/service/status_convert.h"

namespace loom::coordinator {

absl::StatusOr<LogStreamSpec> LogStreamSpecFor(const loom::v1::Job& job,
                                               const loom::v1::StreamLogsRequest& request,
                                               const std::vector<std::string>& other_nodes) {
  if (job.attempt() < 1 || job.placement_size() == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job.id(), " has not been placed yet; its ranks have no logs until it starts"));
  }
  const int attempt = request.attempt() == 0 ? job.attempt() : request.attempt();
  if (attempt < 1 || attempt > job.attempt()) {
    return absl::NotFoundError(absl::StrCat("job ", job.id(), " has had attempts 1 to ",
                                            job.attempt(), "; there is no attempt ", attempt));
  }
  if (request.tail_lines() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tail_lines=", request.tail_lines(), " must not be negative"));
  }
  const int world = job.placement_size();
  if (!request.all_ranks() && (request.rank() < 0 || request.rank() >= world)) {
    return absl::NotFoundError(absl::StrCat("job ", job.id(), " has ranks 0 to ", world - 1,
                                            "; there is no rank ", request.rank()));
  }
  LogStreamSpec spec;
  spec.job_id = job.id();
  spec.attempt = attempt;
  spec.prefix_rank = request.all_ranks();
  spec.follow = request.follow();
  spec.tail_lines = request.tail_lines();
  std::vector<std::string> placed;  // the current placement's nodes, in rank order
  for (const loom::v1::RankPlacement& p : job.placement()) {
    if (std::find(placed.begin(), placed.end(), p.node_id()) == placed.end()) {
      placed.push_back(p.node_id());
    }
  }
  for (const loom::v1::RankPlacement& p : job.placement()) {
    if (!request.all_ranks() && p.rank() != request.rank()) continue;
    LogSource source;
    source.rank = p.rank();
    source.nodes.push_back(p.node_id());
    if (attempt != job.attempt()) {
      for (const std::vector<std::string>* list :
           std::initializer_list<const std::vector<std::string>*>{&placed, &other_nodes}) {
        for (const std::string& node : *list) {
          if (std::find(source.nodes.begin(), source.nodes.end(), node) == source.nodes.end()) {
            source.nodes.push_back(node);
          }
        }
      }
    }
    spec.ranks.push_back(std::move(source));
  }
  std::sort(spec.ranks.begin(), spec.ranks.end(),
            [](const LogSource& a, const LogSource& b) { return a.rank < b.rank; });
  return spec;
}

namespace {

class LogsReactor;

// The relay's end of one call; outlives the reactor (the relay may hold it
// after the call is done), so it holds the reactor only until OnDone.
class ReactorSink final : public LogSink {
 public:
  explicit ReactorSink(grpc::ServerWriteReactor<loom::v1::StreamLogsResponse>* reactor)
      : reactor_(reactor) {}

  bool Writable() override {
    absl::MutexLock lock(&mu_);
    return reactor_ == nullptr || finished_ || !writing_;
  }
  void Write(loom::v1::StreamLogsResponse response) override {
    absl::MutexLock lock(&mu_);
    if (reactor_ == nullptr || finished_) return;
    current_ = std::move(response);
    writing_ = true;
    reactor_->StartWrite(&current_);
  }
  void Finish(const absl::Status& status) override {
    absl::MutexLock lock(&mu_);
    FinishLocked(ToGrpc(status));
  }
  void WriteDone(bool ok) {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "the reader went away"));
  }
  void Detach() {
    absl::MutexLock lock(&mu_);
    reactor_ = nullptr;
  }
  // Held while the stream is opened, so nothing finishes the call before the
  // reactor knows its stream id.
  absl::Mutex& mu() { return mu_; }
  void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (reactor_ == nullptr || finished_) return;
    finished_ = true;
    reactor_->Finish(status);
  }

 private:
  absl::Mutex mu_;
  grpc::ServerWriteReactor<loom::v1::StreamLogsResponse>* reactor_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  loom::v1::StreamLogsResponse current_ ABSL_GUARDED_BY(mu_);
};

class LogsReactor final : public grpc::ServerWriteReactor<loom::v1::StreamLogsResponse> {
 public:
  explicit LogsReactor(LogRelay* relay)
      : relay_(relay), sink_(std::make_shared<ReactorSink>(this)) {}

  void Start(absl::StatusOr<LogStreamSpec> spec) {
    absl::MutexLock lock(&sink_->mu());
    if (spec.ok() && relay_ == nullptr) {
      spec = absl::UnimplementedError("this coordinator does not serve logs");
    }
    if (!spec.ok()) {
      sink_->FinishLocked(ToGrpc(spec.status()));
      return;
    }
    absl::StatusOr<int64_t> id = relay_->Open(*std::move(spec), sink_);
    if (!id.ok()) {
      sink_->FinishLocked(ToGrpc(id.status()));
      return;
    }
    stream_ = *id;
  }

  void OnWriteDone(bool ok) override {
    sink_->WriteDone(ok);
    if (relay_ != nullptr) relay_->Wake();
  }
  void OnCancel() override { sink_->Finish(absl::CancelledError("the reader went away")); }
  void OnDone() override {
    int64_t stream;
    {
      absl::MutexLock lock(&sink_->mu());
      stream = stream_;
    }
    sink_->Detach();
    if (stream != 0) relay_->Close(stream);
    delete this;
  }

 private:
  LogRelay* const relay_;
  const std::shared_ptr<ReactorSink> sink_;
  int64_t stream_ = 0;  // guarded by sink_->mu()
};

}  // namespace

grpc::ServerWriteReactor<loom::v1::StreamLogsResponse>* StartLogStream(
    LogRelay* relay, absl::StatusOr<LogStreamSpec> spec) {
  auto* reactor = new LogsReactor(relay);
  reactor->Start(std::move(spec));
  return reactor;
}

}  // namespace loom::coordinator
