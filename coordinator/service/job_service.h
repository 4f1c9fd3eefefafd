// JobService handlers (callback API): admit the caller (caller_identity.h),
// then translate requests onto the JobManager and the planner; a job is
// visible only to its owner and admins (coordinator/auth/policy.h).
#pragma once

#include <functional>

#include "absl/status/statusor.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/service/caller_identity.h"
#include "loom/v1/job.grpc.pb.h"

namespace loom::coordinator {

using PlanFunction =
    std::function<absl::StatusOr<loom::v1::PlanJobResponse>(const loom::v1::PlanJobRequest&)>;

class JobServiceImpl final : public loom::v1::JobService::CallbackService {
 public:
  JobServiceImpl(JobManager* jobs, PlanFunction plan, const CallerAuth* auth)
      : jobs_(jobs), plan_(std::move(plan)), auth_(auth) {}

  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* context,
                                      const loom::v1::SubmitJobRequest* request,
                                      loom::v1::SubmitJobResponse* response) override;
  grpc::ServerUnaryReactor* PlanJob(grpc::CallbackServerContext* context,
                                    const loom::v1::PlanJobRequest* request,
                                    loom::v1::PlanJobResponse* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const loom::v1::GetJobRequest* request,
                                   loom::v1::Job* response) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const loom::v1::ListJobsRequest* request,
                                     loom::v1::ListJobsResponse* response) override;
  grpc::ServerUnaryReactor* ListNodes(grpc::CallbackServerContext* context,
                                      const loom::v1::ListNodesRequest* request,
                                      loom::v1::ListNodesResponse* response) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* context,
                                      const loom::v1::CancelJobRequest* request,
                                      loom::v1::Job* response) override;
  grpc::ServerWriteReactor<loom::v1::WatchJobResponse>* WatchJob(
      grpc::CallbackServerContext* context, const loom::v1::WatchJobRequest* request) override;

 private:
  // The caller may act on job id: it exists and is theirs (or they are admin).
  absl::Status AuthorizeJob(const auth::Identity& caller, const std::string& id) const;

  JobManager* jobs_;
  PlanFunction plan_;
  const CallerAuth* auth_;
};

}  // namespace loom::coordinator
