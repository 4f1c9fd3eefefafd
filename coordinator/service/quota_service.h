// QuotaService handlers (admin only): change and list the quota book
// (jobs/quota_book.h). A change is saved durably (an fsync, or an etcd
// transaction) on a one-thread pool, never on a callback thread, and answered
// once stored; the scheduler reads the book without waiting for it.
#pragma once

#include "coordinator/jobs/quota_book.h"
#include "coordinator/service/caller_identity.h"
#include "coordinator/service/work_pool.h"
#include "loom/v1/quota.grpc.pb.h"

namespace loom::coordinator {

// The wire form of one entry of the book: `user` or `group`.
loom::v1::Quota QuotaOf(const QuotaTable& table, const std::string& user,
                        const std::string& group);
// Every entry (users, then groups), or those ListQuotasRequest asks for.
loom::v1::ListQuotasResponse ListQuotas(const QuotaTable& table,
                                        const loom::v1::ListQuotasRequest& request);

class QuotaServiceImpl final : public loom::v1::QuotaService::CallbackService {
 public:
  QuotaServiceImpl(QuotaBook* book, const CallerAuth* auth)
      : book_(book), auth_(auth), writes_(1, 16) {}

  grpc::ServerUnaryReactor* SetQuota(grpc::CallbackServerContext* context,
                                     const loom::v1::SetQuotaRequest* request,
                                     loom::v1::Quota* response) override;
  grpc::ServerUnaryReactor* ListQuotas(grpc::CallbackServerContext* context,
                                       const loom::v1::ListQuotasRequest* request,
                                       loom::v1::ListQuotasResponse* response) override;

 private:
  QuotaBook* book_;
  const CallerAuth* auth_;
  WorkPool writes_;  // last: its thread stops before the members it uses go
};

}  // namespace loom::coordinator
