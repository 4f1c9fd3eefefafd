// RankService: the rendezvous store of each job attempt (callback API; a
// waiting StoreGet holds no thread). Every call carries its rank's token over
// its node's certificate: a rank reaches only its attempt's namespace. Ranks
// report progress to their node's agent (AgentService), which forwards it on
// its node session (node_service.cc).
#pragma once

#include "coordinator/jobs/job_manager.h"
#include "coordinator/rendezvous/kv_store.h"
#include "coordinator/service/caller_identity.h"
#include "loom/v1/rank.grpc.pb.h"

namespace loom::coordinator {

class RankServiceImpl final : public loom::v1::RankService::CallbackService {
 public:
  RankServiceImpl(KvStore* kv, JobManager* jobs, const CallerAuth* auth)
      : kv_(kv), jobs_(jobs), auth_(auth) {}

  grpc::ServerUnaryReactor* StoreSet(grpc::CallbackServerContext* context,
                                     const loom::v1::StoreSetRequest* request,
                                     loom::v1::StoreSetResponse* response) override;
  grpc::ServerUnaryReactor* StoreGet(grpc::CallbackServerContext* context,
                                     const loom::v1::StoreGetRequest* request,
                                     loom::v1::StoreGetResponse* response) override;
  grpc::ServerUnaryReactor* StoreAdd(grpc::CallbackServerContext* context,
                                     const loom::v1::StoreAddRequest* request,
                                     loom::v1::StoreAddResponse* response) override;
  // A node's sets and adds of several of its ranks (store_batch.h).
  grpc::ServerUnaryReactor* StoreBatch(grpc::CallbackServerContext* context,
                                       const loom::v1::StoreBatchRequest* request,
                                       loom::v1::StoreBatchResponse* response) override;

 private:
  // Admits a store call in namespace ns, or says why not; a set or add also
  // names its key (a rank entry is written by its own rank only).
  absl::Status AdmitStore(const grpc::CallbackServerContext& context, const std::string& method,
                          const std::string& ns, const std::string* written_key = nullptr) const;

  KvStore* kv_;
  JobManager* jobs_;
  const CallerAuth* auth_;
};

}  // namespace loom::coordinator
