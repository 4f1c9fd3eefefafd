// A coordinator's RankService as far as a node agent's store relay sees it,
// in process on loopback, for the agent tests: records every op and the
// tokens it came with, and can fail, hold or refuse calls (below).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "loom/v1/rank.grpc.pb.h"

namespace loom::agent::testing {

// The coordinator's store as far as the relay sees it: gets of a missing key
// wait until a set (or the end of the test); sets and adds come in
// StoreBatch calls, which can be made to fail whole with UNAVAILABLE a given
// number of times, or be held (the first one while `hold_batch_`) until the
// test releases it. A set of the key "refuse-me" is refused in its result.
class FakeRankService final : public loom::v1::RankService::CallbackService {
 public:
  grpc::ServerUnaryReactor* StoreBatch(grpc::CallbackServerContext* context,
                                       const loom::v1::StoreBatchRequest* request,
                                       loom::v1::StoreBatchResponse* response) override {
    auto* reactor = context->DefaultReactor();
    {
      absl::MutexLock lock(&mu_);
      batch_sizes_.push_back(request->ops_size());
      if (context->client_metadata().count("authorization") > 0) ++batches_with_authorization_;
      for (const loom::v1::StoreOp& op : request->ops()) {
        authorizations_.push_back("Bearer " + op.rank_token());
      }
      if (hold_batch_ && held_.reactor == nullptr) {
        held_ = Held{reactor, request, response};
        return reactor;
      }
      if (fail_batches_ > 0) {
        --fail_batches_;
        reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "restarting"));
        return reactor;
      }
    }
    Apply(*request, response);
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  // Answers the held batch (false if none is held yet).
  bool ReleaseHeld() {
    Held held;
    {
      absl::MutexLock lock(&mu_);
      if (held_.reactor == nullptr) return false;
      held = held_;
      held_ = Held{};
      hold_batch_ = false;
    }
    Apply(*held.request, held.response);
    held.reactor->Finish(grpc::Status::OK);
    return true;
  }
  bool holding() {
    absl::MutexLock lock(&mu_);
    return held_.reactor != nullptr;
  }
  grpc::ServerUnaryReactor* StoreGet(grpc::CallbackServerContext* context,
                                     const loom::v1::StoreGetRequest* request,
                                     loom::v1::StoreGetResponse* response) override {
    auto* reactor = context->DefaultReactor();
    absl::MutexLock lock(&mu_);
    ++gets_;
    Note(*context);
    auto it = values_.find(request->key());
    if (it != values_.end()) {
      response->set_value(it->second);
      reactor->Finish(grpc::Status::OK);
    } else {
      parked_.push_back(Parked{request->key(), reactor, response,
                               absl::Now() + absl::Milliseconds(request->wait_ms())});
    }
    return reactor;
  }
  // As the coordinator does at wait_ms: DEADLINE_EXCEEDED for gets still
  // waiting (called by the test's expiry thread).
  void ExpireParked() {
    std::vector<Parked> expired;
    {
      absl::MutexLock lock(&mu_);
      const absl::Time now = absl::Now();
      for (auto it = parked_.begin(); it != parked_.end();) {
        if (it->until <= now) {
          expired.push_back(*it);
          it = parked_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (Parked& p : expired) {
      p.reactor->Finish(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "not set in time"));
    }
  }
  // Ends the gets still waiting (before the server shuts down).
  void FinishParked() {
    std::vector<Parked> left;
    {
      absl::MutexLock lock(&mu_);
      left.swap(parked_);
    }
    for (Parked& p : left) p.reactor->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "ending"));
  }
  int parked() {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(parked_.size());
  }
  // The keys set so far, with their values.
  std::map<std::string, std::string> values() {
    absl::MutexLock lock(&mu_);
    return values_;
  }
  int sets() {
    absl::MutexLock lock(&mu_);
    return sets_;
  }

  absl::Mutex mu_;
  int sets_ ABSL_GUARDED_BY(mu_) = 0;
  int gets_ ABSL_GUARDED_BY(mu_) = 0;
  int adds_ ABSL_GUARDED_BY(mu_) = 0;
  int fail_batches_ ABSL_GUARDED_BY(mu_) = 0;
  bool hold_batch_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<int> batch_sizes_ ABSL_GUARDED_BY(mu_);  // ops of each StoreBatch
  int batches_with_authorization_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> authorizations_ ABSL_GUARDED_BY(mu_);

 private:
  struct Held {
    grpc::ServerUnaryReactor* reactor = nullptr;
    const loom::v1::StoreBatchRequest* request = nullptr;
    loom::v1::StoreBatchResponse* response = nullptr;
  };
  // Applies each op and answers its result; a set wakes the gets of its key.
  void Apply(const loom::v1::StoreBatchRequest& request, loom::v1::StoreBatchResponse* response) {
    std::vector<std::pair<Parked, std::string>> ready;
    {
      absl::MutexLock lock(&mu_);
      for (const loom::v1::StoreOp& op : request.ops()) {
        loom::v1::StoreOpResult* result = response->add_results();
        if (op.has_set()) {
          ++sets_;
          if (op.set().key() == "refuse-me") {
            result->set_code(grpc::StatusCode::PERMISSION_DENIED);
            result->set_message("refused");
            continue;
          }
          values_[op.set().key()] = op.set().value();
          for (auto it = parked_.begin(); it != parked_.end();) {
            if (it->key == op.set().key()) {
              ready.emplace_back(*it, op.set().value());
              it = parked_.erase(it);
            } else {
              ++it;
            }
          }
        } else {
          ++adds_;
          int64_t& counter = counters_[op.add().key()];
          counter += op.add().delta();
          result->set_value(counter);
        }
      }
    }
    for (auto& [p, value] : ready) {
      p.response->set_value(value);
      p.reactor->Finish(grpc::Status::OK);
    }
  }
  struct Parked {
    std::string key;
    grpc::ServerUnaryReactor* reactor;
    loom::v1::StoreGetResponse* response;
    absl::Time until;
  };
  void Note(const grpc::CallbackServerContext& context) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = context.client_metadata().find("authorization");
    authorizations_.push_back(it == context.client_metadata().end()
                                  ? std::string()
                                  : std::string(it->second.data(), it->second.size()));
  }
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> counters_ ABSL_GUARDED_BY(mu_);
  std::vector<Parked> parked_ ABSL_GUARDED_BY(mu_);
  Held held_ ABSL_GUARDED_BY(mu_);
};

}  // namespace loom::agent::testing
