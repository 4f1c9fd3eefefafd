#include "coordinator/service/job_service.h"

#include <optional>
#include <memory>

#include "absl/synchronization/mutex.h"
#include "coordinator/service/status_convert.h"
#include "coordinator/service/watch_queue.h"

namespace loom::coordinator {
namespace {

using loom::v1::WatchJobResponse;

// Finishes a unary call with the value or the error of a StatusOr.
template <typename T, typename Out>
grpc::ServerUnaryReactor* Reply(grpc::CallbackServerContext* context,
                                absl::StatusOr<T> result, Out* out) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (result.ok()) {
    *out = *std::move(result);
    reactor->Finish(grpc::Status::OK);
  } else {
    reactor->Finish(ToGrpc(result.status()));
  }
  return reactor;
}

// One WatchJob stream. The manager holds the Relay (shared); the reactor is
// owned by gRPC and detaches from the relay when the call is done, so a late
// update never touches a deleted reactor.
class WatchReactor;

class Relay final : public WatchSink {
 public:
  explicit Relay(WatchReactor* reactor) : reactor_(reactor) {}
  void Push(const WatchJobResponse& update, bool last) override;
  void Detach() {
    absl::MutexLock lock(&mu_);
    reactor_ = nullptr;
  }

 private:
  absl::Mutex mu_;
  WatchReactor* reactor_ ABSL_GUARDED_BY(mu_);
};

class WatchReactor final : public grpc::ServerWriteReactor<WatchJobResponse> {
 public:
  WatchReactor(JobManager* jobs, std::string id) : jobs_(jobs), id_(std::move(id)) {}

  void Start() {
    relay_ = std::make_shared<Relay>(this);
    absl::StatusOr<int64_t> handle = jobs_->Watch(id_, relay_);
    if (!handle.ok()) {
      relay_->Detach();
      Finish(ToGrpc(handle.status()));
      return;
    }
    absl::MutexLock lock(&mu_);
    handle_ = *handle;
  }

  void Enqueue(const WatchJobResponse& update, bool last) {
    absl::MutexLock lock(&mu_);
    if (finishing_) return;
    if (!queue_.Push(update)) {
      FinishLocked(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                "this watcher reads too slowly; watch again to resume"));
      return;
    }
    if (last) last_queued_ = true;
    if (!writing_) WriteNextLocked();
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) {
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "watcher went away"));
      return;
    }
    WriteNextLocked();
  }

  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    FinishLocked(grpc::Status::CANCELLED);
  }

  void OnDone() override {
    relay_->Detach();
    int64_t handle;
    {
      absl::MutexLock lock(&mu_);
      handle = handle_;
    }
    if (handle != 0) jobs_->Unwatch(id_, handle);
    delete this;
  }

 private:
  void WriteNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finishing_) return;
    std::optional<WatchJobResponse> next = queue_.Pop();
    if (!next) {
      if (last_queued_) FinishLocked(grpc::Status::OK);
      return;
    }
    current_ = *std::move(next);
    writing_ = true;
    StartWrite(&current_);
  }

  void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finishing_) return;
    finishing_ = true;
    Finish(status);
  }

  JobManager* jobs_;
  const std::string id_;
  std::shared_ptr<Relay> relay_;
  absl::Mutex mu_;
  int64_t handle_ ABSL_GUARDED_BY(mu_) = 0;
  WatchQueue queue_ ABSL_GUARDED_BY(mu_);
  WatchJobResponse current_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool last_queued_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
};

void Relay::Push(const WatchJobResponse& update, bool last) {
  absl::MutexLock lock(&mu_);
  if (reactor_ != nullptr) reactor_->Enqueue(update, last);
}

}  // namespace

grpc::ServerUnaryReactor* JobServiceImpl::SubmitJob(grpc::CallbackServerContext* context,
                                                    const loom::v1::SubmitJobRequest* request,
                                                    loom::v1::SubmitJobResponse* response) {
  // Admission (parse, plan, a durable write) runs on the manager's admission
  // thread; this reaction only queues it.
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  jobs_->SubmitAsync(request->spec_yaml(), request->source_name(), request->base_dir(),
                     [reactor, response](absl::StatusOr<loom::v1::Job> job) {
                       if (job.ok()) {
                         *response->mutable_job() = *std::move(job);
                         reactor->Finish(grpc::Status::OK);
                       } else {
                         reactor->Finish(ToGrpc(job.status()));
                       }
                     });
  return reactor;
}

grpc::ServerUnaryReactor* JobServiceImpl::PlanJob(grpc::CallbackServerContext* context,
                                                  const loom::v1::PlanJobRequest* request,
                                                  loom::v1::PlanJobResponse* response) {
  return Reply(context, plan_(*request), response);
}

grpc::ServerUnaryReactor* JobServiceImpl::GetJob(grpc::CallbackServerContext* context,
                                                 const loom::v1::GetJobRequest* request,
                                                 loom::v1::Job* response) {
  return Reply(context, jobs_->Get(request->id()), response);
}

grpc::ServerUnaryReactor* JobServiceImpl::ListJobs(grpc::CallbackServerContext* context,
                                                   const loom::v1::ListJobsRequest* request,
                                                   loom::v1::ListJobsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<JobPage> page = jobs_->List(request->page_size(), request->page_token());
  if (!page.ok()) {
    reactor->Finish(ToGrpc(page.status()));
    return reactor;
  }
  for (auto& job : page->jobs) *response->add_jobs() = std::move(job);
  response->set_next_page_token(page->next_page_token);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* JobServiceImpl::DeleteJob(grpc::CallbackServerContext* context,
                                                    const loom::v1::DeleteJobRequest* request,
                                                    loom::v1::DeleteJobResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpc(jobs_->Delete(request->id())));
  return reactor;
}

grpc::ServerUnaryReactor* JobServiceImpl::UncordonNode(
    grpc::CallbackServerContext* context, const loom::v1::UncordonNodeRequest* request,
    loom::v1::Node* response) {
  return Reply(context, jobs_->Uncordon(request->node_id()), response);
}

grpc::ServerUnaryReactor* JobServiceImpl::ListNodes(grpc::CallbackServerContext* context,
                                                    const loom::v1::ListNodesRequest* request,
                                                    loom::v1::ListNodesResponse* response) {
  for (auto& node : jobs_->ListNodes()) *response->add_nodes() = std::move(node);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* JobServiceImpl::CancelJob(grpc::CallbackServerContext* context,
                                                    const loom::v1::CancelJobRequest* request,
                                                    loom::v1::Job* response) {
  return Reply(context, jobs_->Cancel(request->id()), response);
}

grpc::ServerWriteReactor<WatchJobResponse>* JobServiceImpl::WatchJob(
    grpc::CallbackServerContext* context, const loom::v1::WatchJobRequest* request) {
  auto* reactor = new WatchReactor(jobs_, request->id());
  reactor->Start();
  return reactor;
}

}  // namespace loom::coordinator
