// RankService: the rendezvous store of each job attempt and the progress
// streams of the ranks (callback API; a waiting StoreGet holds no thread).
#pragma once

#include "coordinator/jobs/job_manager.h"
#include "coordinator/rendezvous/kv_store.h"
#include "loom/v1/rank.grpc.pb.h"

namespace loom::coordinator {

class RankServiceImpl final : public loom::v1::RankService::CallbackService {
 public:
  RankServiceImpl(KvStore* kv, JobManager* jobs) : kv_(kv), jobs_(jobs) {}

  grpc::ServerUnaryReactor* StoreSet(grpc::CallbackServerContext* context,
                                     const loom::v1::StoreSetRequest* request,
                                     loom::v1::StoreSetResponse* response) override;
  grpc::ServerUnaryReactor* StoreGet(grpc::CallbackServerContext* context,
                                     const loom::v1::StoreGetRequest* request,
                                     loom::v1::StoreGetResponse* response) override;
  grpc::ServerUnaryReactor* StoreAdd(grpc::CallbackServerContext* context,
                                     const loom::v1::StoreAddRequest* request,
                                     loom::v1::StoreAddResponse* response) override;
  grpc::ServerReadReactor<loom::v1::RankProgress>* ReportProgress(
      grpc::CallbackServerContext* context, loom::v1::ReportProgressResponse* response) override;

 private:
  KvStore* kv_;
  JobManager* jobs_;
};

}  // namespace loom::coordinator
