#include "coordinator/service/job_service.h"

#include <map>
#include <vector>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/auth/policy.h"
#include "coordinator/service/logs_stream.h"
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

// Finishes a unary call that was refused.
grpc::ServerUnaryReactor* Refuse(grpc::CallbackServerContext* context, const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpc(status));
  return reactor;
}

constexpr char kMethodPrefix[] = "/loom.v1.JobService/";

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
  // Ends the stream (its caller's token was revoked), if it still runs.
  void End(const absl::Status& status);

 private:
  absl::Mutex mu_;
  WatchReactor* reactor_ ABSL_GUARDED_BY(mu_);
};

class WatchReactor final : public grpc::ServerWriteReactor<WatchJobResponse> {
 public:
  WatchReactor(JobManager* jobs, std::string id) : jobs_(jobs), id_(std::move(id)) {}

  // A stream opened with a user token ends when that user's tokens are
  // revoked (token_streams.h).
  void EndOnRevocation(TokenStreams* streams, const std::string& user) {
    streams_ = streams;
    streams_handle_ = streams->Add(user, [relay = relay_] {
      relay->End(absl::UnauthenticatedError("bearer token revoked; this watch has ended"));
    });
  }

  void EndWith(const absl::Status& status) {
    absl::MutexLock lock(&mu_);
    FinishLocked(ToGrpc(status));
  }

  // A watch the caller may not open ends at once with this status.
  void Refuse(const absl::Status& status) {
    relay_ = std::make_shared<Relay>(this);
    relay_->Detach();
    absl::MutexLock lock(&mu_);
    FinishLocked(ToGrpc(status));
  }

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
    if (streams_ != nullptr) streams_->Remove(streams_handle_);
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
  TokenStreams* streams_ = nullptr;
  int64_t streams_handle_ = 0;
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

void Relay::End(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (reactor_ != nullptr) reactor_->EndWith(status);
}

}  // namespace

absl::Status JobServiceImpl::AuthorizeJob(const auth::Identity& caller,
                                          const std::string& id) const {
  absl::StatusOr<loom::v1::Job> job = jobs_->Get(id);
  if (!job.ok()) return job.status();
  return auth::AuthorizeJob(caller, id, job->owner());
}

grpc::ServerUnaryReactor* JobServiceImpl::SubmitJob(grpc::CallbackServerContext* context,
                                                    const loom::v1::SubmitJobRequest* request,
                                                    loom::v1::SubmitJobResponse* response) {
  absl::StatusOr<auth::Identity> caller =
      auth_->Admit(*context, absl::StrCat(kMethodPrefix, "SubmitJob"));
  if (!caller.ok()) return Refuse(context, caller.status());
  // Admission (parse, plan, a durable write) runs on the manager's admission
  // thread; this reaction only queues it.
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  jobs_->SubmitAsync(request->spec_yaml(), request->source_name(), request->base_dir(),
                     auth::OwnerName(*caller), [reactor, response](absl::StatusOr<loom::v1::Job> job) {
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
  absl::StatusOr<auth::Identity> caller =
      auth_->Admit(*context, absl::StrCat(kMethodPrefix, "PlanJob"));
  if (!caller.ok()) return Refuse(context, caller.status());
  // A search takes from milliseconds to seconds of CPU: never on a callback
  // thread, and never more of them at once than the pool holds.
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const bool queued = plans_.TrySubmit(
      [this, request, response, reactor] {
        absl::StatusOr<loom::v1::PlanJobResponse> plan = plan_(*request);
        if (plan.ok()) {
          *response = *std::move(plan);
          reactor->Finish(grpc::Status::OK);
        } else {
          reactor->Finish(ToGrpc(plan.status()));
        }
      },
      auth::OwnerName(*caller));
  if (!queued) {
    reactor->Finish(ToGrpc(absl::ResourceExhaustedError(absl::StrCat(
        "the coordinator is already planning ", plans_.capacity(), " requests, or ",
        plans_.max_per_key(), " of yours (its bounds); retry, or plan here with loomctl plan "
        "--offline"))));
  }
  return reactor;
}

grpc::Status JobServiceImpl::GetJob(grpc::ServerContext* context,
                                    const loom::v1::GetJobRequest* request,
                                    loom::v1::Job* response) {
  absl::StatusOr<auth::Identity> caller =
      auth_->Admit(*context, absl::StrCat(kMethodPrefix, "GetJob"));
  if (!caller.ok()) return ToGrpc(caller.status());
  absl::StatusOr<loom::v1::Job> job = jobs_->Get(request->id(), request->view());
  if (!job.ok()) return ToGrpc(job.status());
  if (absl::Status s = auth::AuthorizeJob(*caller, job->id(), job->owner()); !s.ok()) {
    return ToGrpc(s);
  }
  *response = *std::move(job);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::ListJobs(grpc::ServerContext* context,
                                      const loom::v1::ListJobsRequest* request,
                                      loom::v1::ListJobsResponse* response) {
  absl::StatusOr<auth::Identity> caller =
      auth_->Admit(*context, absl::StrCat(kMethodPrefix, "ListJobs"));
  if (!caller.ok()) return ToGrpc(caller.status());
  const auth::Identity identity = *caller;
  absl::StatusOr<JobPage> page =
      jobs_->List(request->page_size(), request->page_token(),
                  [&identity](const loom::v1::Job& job) { return auth::MaySeeJob(identity, job.owner()); });
  if (!page.ok()) return ToGrpc(page.status());
  for (auto& job : page->jobs) *response->add_jobs() = std::move(job);
  response->set_next_page_token(page->next_page_token);
  return grpc::Status::OK;
}

grpc::ServerUnaryReactor* JobServiceImpl::DeleteJob(grpc::CallbackServerContext* context,
                                                    const loom::v1::DeleteJobRequest* request,
                                                    loom::v1::DeleteJobResponse* response) {
  absl::StatusOr<auth::Identity> caller =
      auth_->Admit(*context, absl::StrCat(kMethodPrefix, "DeleteJob"));
  if (!caller.ok()) return Refuse(context, caller.status());
  if (absl::Status s = AuthorizeJob(*caller, request->id()); !s.ok()) return Refuse(context, s);
  // Answered by the persister once the store has deleted it.
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  jobs_->DeleteAsync(request->id(),
                     [reactor](absl::Status status) { reactor->Finish(ToGrpc(status)); });
  return reactor;
}

grpc::ServerUnaryReactor* JobServiceImpl::UncordonNode(
    grpc::CallbackServerContext* context, const loom::v1::UncordonNodeRequest* request,
    loom::v1::Node* response) {
  absl::StatusOr<auth::Identity> caller =
      auth_->Admit(*context, absl::StrCat(kMethodPrefix, "UncordonNode"));
  if (!caller.ok()) return Refuse(context, caller.status());
  return Reply(context, jobs_->Uncordon(request->node_id()), response);
}

grpc::ServerUnaryReactor* JobServiceImpl::DrainNode(grpc::CallbackServerContext* context,
                                                    const loom::v1::DrainNodeRequest* request,
                                                    loom::v1::Node* response) {
  absl::StatusOr<auth::Identity> caller =
      auth_->Admit(*context, absl::StrCat(kMethodPrefix, "DrainNode"));
  if (!caller.ok()) return Refuse(context, caller.status());
  if (request->reason().size() > 512) {
    return Refuse(context, absl::InvalidArgumentError(absl::StrCat(
                               "reason: ", request->reason().size(),
                               " bytes; at most 512 (a line for the history)")));
  }
  const std::string reason = request->reason().empty()
                                 ? absl::StrCat("by ", caller->name)
                                 : absl::StrCat(request->reason(), " (by ", caller->name, ")");
  return Reply(context, jobs_->Drain(request->node_id(), reason), response);
}

grpc::Status JobServiceImpl::ListNodes(grpc::ServerContext* context,
                                       const loom::v1::ListNodesRequest* request,
                                       loom::v1::ListNodesResponse* response) {
  absl::StatusOr<auth::Identity> caller =
      auth_->Admit(*context, absl::StrCat(kMethodPrefix, "ListNodes"));
  if (!caller.ok()) return ToGrpc(caller.status());
  for (auto& node : jobs_->ListNodes()) *response->add_nodes() = std::move(node);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::ListQueue(grpc::ServerContext* context,
                                       const loom::v1::ListQueueRequest* request,
                                       loom::v1::ListQueueResponse* response) {
  absl::StatusOr<auth::Identity> caller =
      auth_->Admit(*context, absl::StrCat(kMethodPrefix, "ListQueue"));
  if (!caller.ok()) return ToGrpc(caller.status());
  const std::vector<QueueEntry> queue = jobs_->Queue();
  std::map<std::string, std::string> owners;
  for (const QueueEntry& e : queue) owners[e.job_id] = e.owner;
  int32_t position = 0;
  for (const QueueEntry& e : queue) {
    ++position;
    if (!auth::MaySeeJob(*caller, e.owner)) continue;
    std::string reason = e.reason;
    // Another user's job is not named to a user (ids are not shown across owners).
    if (auto ahead = owners.find(e.behind);
        ahead != owners.end() && !auth::MaySeeJob(*caller, ahead->second)) {
      reason = absl::StrReplaceAll(reason, {{ahead->first + " (", "another user's job ("},
                                            {ahead->first + "'s", "another user's job's"}});
    }
    loom::v1::QueuedJob* job = response->add_jobs();
    job->set_id(e.job_id);
    job->set_owner(e.owner);
    job->set_position(position);
    job->set_priority(e.priority);
    job->set_device_kind(e.kind);
    job->set_devices(e.devices);
    job->set_created_unix_ms(e.created_unix_ms);
    job->set_action(sched::ActionName(e.action));
    job->set_reason(reason);
  }
  response->set_total(position);
  return grpc::Status::OK;
}

grpc::ServerUnaryReactor* JobServiceImpl::CancelJob(grpc::CallbackServerContext* context,
                                                    const loom::v1::CancelJobRequest* request,
                                                    loom::v1::Job* response) {
  absl::StatusOr<auth::Identity> caller =
      auth_->Admit(*context, absl::StrCat(kMethodPrefix, "CancelJob"));
  if (!caller.ok()) return Refuse(context, caller.status());
  if (absl::Status s = AuthorizeJob(*caller, request->id()); !s.ok()) return Refuse(context, s);
  // Answered by the persister once the cancel is stored.
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  jobs_->CancelAsync(request->id(), [reactor, response](absl::StatusOr<loom::v1::Job> job) {
    if (job.ok()) {
      *response = *std::move(job);
      reactor->Finish(grpc::Status::OK);
    } else {
      reactor->Finish(ToGrpc(job.status()));
    }
  });
  return reactor;
}

grpc::ServerWriteReactor<WatchJobResponse>* JobServiceImpl::WatchJob(
    grpc::CallbackServerContext* context, const loom::v1::WatchJobRequest* request) {
  auto* reactor = new WatchReactor(jobs_, request->id());
  absl::StatusOr<auth::Identity> caller =
      auth_->Admit(*context, absl::StrCat(kMethodPrefix, "WatchJob"));
  absl::Status allowed = caller.ok() ? AuthorizeJob(*caller, request->id()) : caller.status();
  if (!allowed.ok()) {
    reactor->Refuse(allowed);
    return reactor;
  }
  reactor->Start();
  if (caller->credential == auth::Credential::kToken && token_streams_ != nullptr) {
    reactor->EndOnRevocation(token_streams_, caller->name);
    // A revocation stored between the check above and now found no stream
    // to end: the token is checked once more.
    if (absl::StatusOr<auth::Identity> again =
            auth_->Admit(*context, absl::StrCat(kMethodPrefix, "WatchJob"));
        !again.ok()) {
      reactor->EndWith(again.status());
    }
  }
  return reactor;
}

grpc::ServerWriteReactor<loom::v1::StreamLogsResponse>* JobServiceImpl::StreamLogs(
    grpc::CallbackServerContext* context, const loom::v1::StreamLogsRequest* request) {
  auto spec = [&]() -> absl::StatusOr<LogStreamSpec> {
    absl::StatusOr<auth::Identity> caller =
        auth_->Admit(*context, absl::StrCat(kMethodPrefix, "StreamLogs"));
    if (!caller.ok()) return caller.status();
    absl::StatusOr<loom::v1::Job> job = jobs_->Get(request->id(), loom::v1::JOB_VIEW_FULL);
    if (!job.ok()) return job.status();
    if (absl::Status s = auth::AuthorizeJob(*caller, job->id(), job->owner()); !s.ok()) return s;
    std::vector<std::string> nodes;  // for an earlier attempt's ranks
    for (const loom::v1::Node& node : jobs_->ListNodes()) nodes.push_back(node.node_id());
    return LogStreamSpecFor(*job, *request, nodes);
  }();
  return StartLogStream(logs_, std::move(spec));
}

grpc::ServerUnaryReactor* JobServiceImpl::TraceJob(grpc::CallbackServerContext* context,
                                                   const loom::v1::TraceJobRequest* request,
                                                   loom::v1::TraceJobResponse* response) {
  absl::StatusOr<auth::Identity> caller =
      auth_->Admit(*context, absl::StrCat(kMethodPrefix, "TraceJob"));
  if (!caller.ok()) return Refuse(context, caller.status());
  absl::StatusOr<loom::v1::Job> job = jobs_->Get(request->id(), loom::v1::JOB_VIEW_FULL);
  if (!job.ok()) return Refuse(context, job.status());
  // A foreign job reads as one that does not exist.
  if (absl::Status s = auth::AuthorizeJob(*caller, job->id(), job->owner()); !s.ok()) {
    return Refuse(context, s);
  }
  if (traces_ == nullptr) {
    return Refuse(context, absl::UnimplementedError("this coordinator does not record traces"));
  }
  absl::StatusOr<TraceSpec> spec = TraceSpecFor(*job, *request);
  if (!spec.ok()) return Refuse(context, spec.status());
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::Status started = traces_->Start(
      *std::move(spec), [reactor, response](absl::StatusOr<loom::v1::TraceJobResponse> answer) {
        if (answer.ok()) {
          *response = *std::move(answer);
          reactor->Finish(grpc::Status::OK);
        } else {
          reactor->Finish(ToGrpc(answer.status()));
        }
      });
  if (!started.ok()) reactor->Finish(ToGrpc(started));
  return reactor;
}

}  // namespace loom::coordinator
