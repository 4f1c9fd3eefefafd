// JobService handlers: admit the caller (caller_identity.h), then translate
// requests onto the JobManager and the planner; a job is visible only to its
// owner and admins (coordinator/auth/policy.h).
//
// The reads users and dashboards poll (GetJob, ListJobs, ListNodes, ListQueue) are sync
// methods, answered on the sync server's own threads; the rest use the
// callback API. gRPC runs every callback of the process (every node session
// and every rank's progress stream) on two threads: a poll queued there waits
// behind whatever burst of reports is ahead of it, and those threads, always
// busy, are the last the kernel schedules on a loaded machine. A sync thread
// sleeps until a read arrives (docs/scale.md).
//
// No callback waits: SubmitJob is answered by the admission thread, CancelJob
// and DeleteJob by the persister once their change is stored, PlanJob by a
// small bounded pool (RESOURCE_EXHAUSTED when it is full).
#pragma once

#include <functional>

#include "absl/status/statusor.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/service/caller_identity.h"
#include "coordinator/service/log_relay.h"
#include "coordinator/service/token_streams.h"
#include "coordinator/service/trace_relay.h"
#include "coordinator/service/work_pool.h"
#include "loom/v1/job.grpc.pb.h"

namespace loom::coordinator {

using PlanFunction =
    std::function<absl::StatusOr<loom::v1::PlanJobResponse>(const loom::v1::PlanJobRequest&)>;

using JobServiceBase = loom::v1::JobService::WithCallbackMethod_SubmitJob<
    loom::v1::JobService::WithCallbackMethod_PlanJob<
        loom::v1::JobService::WithCallbackMethod_CancelJob<
            loom::v1::JobService::WithCallbackMethod_DeleteJob<
                loom::v1::JobService::WithCallbackMethod_UncordonNode<
                    loom::v1::JobService::WithCallbackMethod_DrainNode<
                        loom::v1::JobService::WithCallbackMethod_WatchJob<
                            loom::v1::JobService::WithCallbackMethod_StreamLogs<
                                loom::v1::JobService::WithCallbackMethod_TraceJob<
                                    loom::v1::JobService::Service>>>>>>>>>;

struct JobServiceOptions {
  // Planner searches at once, and waiting beyond them (PlanJob).
  int plan_threads = 2;
  size_t plan_queue = 8;
  // One caller's searches at once (queued or running): one user cannot hold
  // every planner thread and slot.
  size_t plans_per_user = 2;
  // Where streams opened with user tokens register, so that revoking the
  // tokens ends them (token_streams.h); null: not tracked.
  TokenStreams* token_streams = nullptr;
};

class JobServiceImpl final : public JobServiceBase {
 public:
  JobServiceImpl(JobManager* jobs, PlanFunction plan, const CallerAuth* auth,
                 JobServiceOptions options = {})
      : jobs_(jobs),
        plan_(std::move(plan)),
        auth_(auth),
        token_streams_(options.token_streams),
        plans_(options.plan_threads, options.plan_queue,
               // Below the session and heartbeat threads: a search never
               // delays a heartbeat on a busy machine.
               WorkPool::Options{.max_per_key = options.plans_per_user, .nice = 10}) {}

  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* context,
                                      const loom::v1::SubmitJobRequest* request,
                                      loom::v1::SubmitJobResponse* response) override;
  grpc::ServerUnaryReactor* PlanJob(grpc::CallbackServerContext* context,
                                    const loom::v1::PlanJobRequest* request,
                                    loom::v1::PlanJobResponse* response) override;
  // Sync: see above.
  grpc::Status GetJob(grpc::ServerContext* context, const loom::v1::GetJobRequest* request,
                      loom::v1::Job* response) override;
  grpc::Status ListJobs(grpc::ServerContext* context, const loom::v1::ListJobsRequest* request,
                        loom::v1::ListJobsResponse* response) override;
  grpc::Status ListNodes(grpc::ServerContext* context, const loom::v1::ListNodesRequest* request,
                         loom::v1::ListNodesResponse* response) override;
  // Sync: a read of the scheduler's last queue (never the job table's lock).
  grpc::Status ListQueue(grpc::ServerContext* context, const loom::v1::ListQueueRequest* request,
                         loom::v1::ListQueueResponse* response) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* context,
                                      const loom::v1::CancelJobRequest* request,
                                      loom::v1::Job* response) override;
  grpc::ServerUnaryReactor* DeleteJob(grpc::CallbackServerContext* context,
                                      const loom::v1::DeleteJobRequest* request,
                                      loom::v1::DeleteJobResponse* response) override;
  grpc::ServerUnaryReactor* DrainNode(grpc::CallbackServerContext* context,
                                      const loom::v1::DrainNodeRequest* request,
                                      loom::v1::Node* response) override;
  grpc::ServerUnaryReactor* UncordonNode(grpc::CallbackServerContext* context,
                                         const loom::v1::UncordonNodeRequest* request,
                                         loom::v1::Node* response) override;
  grpc::ServerWriteReactor<loom::v1::WatchJobResponse>* WatchJob(
      grpc::CallbackServerContext* context, const loom::v1::WatchJobRequest* request) override;
  // A rank's log lines through the LogRelay (logs_stream.h); UNIMPLEMENTED
  // without one.
  grpc::ServerWriteReactor<loom::v1::StreamLogsResponse>* StreamLogs(
      grpc::CallbackServerContext* context, const loom::v1::StreamLogsRequest* request) override;

  // One step recorded on the job's ranks, as a Chrome trace-event JSON,
  // answered by the TraceRelay's thread once every trace is in or the wait
  // ends (trace_relay.h); UNIMPLEMENTED without one.
  grpc::ServerUnaryReactor* TraceJob(grpc::CallbackServerContext* context,
                                     const loom::v1::TraceJobRequest* request,
                                     loom::v1::TraceJobResponse* response) override;

  // Set before serving; outlives the service.
  void SetLogRelay(LogRelay* relay) { logs_ = relay; }
  void SetTraceRelay(TraceRelay* relay) { traces_ = relay; }

 private:
  // The caller may act on job id: it exists and is theirs (or they are admin).
  absl::Status AuthorizeJob(const auth::Identity& caller, const std::string& id) const;

  JobManager* jobs_;
  PlanFunction plan_;
  const CallerAuth* auth_;
  LogRelay* logs_ = nullptr;
  TraceRelay* traces_ = nullptr;
  TokenStreams* const token_streams_;
  WorkPool plans_;  // last: its threads stop before the members they use go
};

}  // namespace loom::coordinator
