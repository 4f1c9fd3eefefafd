#include "worker/agent/store_relay.h"

#include <algorithm>
#include <deque>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/rpc/store_quotas.h"
#include "worker/agent/callback_timer.h"
#include "loom/v1/rank.grpc.pb.h"

namespace loom::agent {
namespace {

using Key = std::pair<std::string, std::string>;  // namespace, key

grpc::Status Stopping() {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the node agent is stopping");
}

grpc::Status Fenced() {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                      "the node agent's lease ran out after this store call came, so it is not "
                      "relayed; the rank is paused until the coordinator resumes it");
}

std::string RankKey(const RankIdentity& rank) {
  return absl::StrCat(rank.job_id, "/", rank.attempt, "/", rank.rank);
}

// One upstream call: its context, messages and stub live until its callback.
struct CallBase {
  virtual ~CallBase() = default;
  grpc::ClientContext context;
};
template <typename Request, typename Response>
struct Call final : CallBase {
  Request request;
  Response response;
  std::unique_ptr<loom::v1::RankService::Stub> stub;
};

}  // namespace

absl::Status CheckStoreCall(const RankIdentity& rank, const std::string& store_namespace,
                            const std::string& key, size_t value_bytes) {
  const rpc::StoreQuotas quotas;  // the coordinator's own bounds
  if (absl::Status paused = CheckNotPaused(rank); !paused.ok()) return paused;
  if (store_namespace.empty() || key.empty()) {
    return absl::InvalidArgumentError("store_namespace and key must both be set");
  }
  if (store_namespace != rank.store_namespace) {
    return absl::PermissionDeniedError(absl::StrCat(
        "store_namespace '", store_namespace.substr(0, 128), "' is not the namespace of job ",
        rank.job_id, " attempt ", rank.attempt, " rank ", rank.rank,
        ": a rank uses only its own attempt's store"));
  }
  if (static_cast<int64_t>(key.size()) > quotas.max_key_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("store key has ", key.size(),
                                                   " bytes; at most ", quotas.max_key_bytes));
  }
  // The coordinator's default (--store_max_value_bytes); its code too.
  if (static_cast<int64_t>(value_bytes) > quotas.max_value_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "store value has ", value_bytes, " bytes; an agent relays at most ",
        quotas.max_value_bytes));
  }
  return absl::OkStatus();
}

class StoreRelay::Impl : public std::enable_shared_from_this<Impl> {
 public:
  Impl(std::shared_ptr<rpc::CoordinatorChannel> coordinators, StoreRelayOptions options,
       Lease* lease)
      : coordinators_(std::move(coordinators)), options_(options), lease_(lease) {}

  // Whether a call admitted in lease generation `admitted` may still go
  // upstream, given the lease's state now.
  bool MayGo(uint64_t admitted, const Lease::State& lease) const {
    return lease_ == nullptr || (!lease.expired && lease.generation == admitted);
  }
  Lease::State LeaseNow() const { return lease_ != nullptr ? lease_->Observe() : Lease::State{}; }

  // A slot for one pending call of `rank`, or why not.
  grpc::Status Admit(const std::string& rank) {
    absl::MutexLock lock(&mu_);
    if (stopping_) return Stopping();
    int& mine = per_rank_[rank];
    if (mine >= options_.max_pending_per_rank) {
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          absl::StrCat("rank ", rank, " has ", mine,
                                       " store calls pending at its node agent; at most ",
                                       options_.max_pending_per_rank, " (max_pending_per_rank)"));
    }
    if (pending_ >= options_.max_pending) {
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          absl::StrCat("the node agent holds ", pending_,
                                       " store calls of its ranks; at most ", options_.max_pending,
                                       " (max_pending)"));
    }
    ++mine;
    ++pending_;
    return grpc::Status::OK;
  }
  void Release(const std::string& rank) {
    absl::MutexLock lock(&mu_);
    ReleaseLocked(rank);
  }

  // Starts one upstream call; `then` runs once with its status and response
  // (UNAVAILABLE without a call when stopping).
  template <typename Request, typename Response, typename Issue, typename Then>
  void Upstream(const std::string& token, Request request, absl::Time deadline, Issue issue,
                Then then) {
    auto call = std::make_shared<Call<Request, Response>>();
    call->request = std::move(request);
    call->context.set_deadline(absl::ToChronoTime(deadline));
    // A batch is the node's own call: its ops carry their ranks' tokens.
    if (!token.empty()) call->context.AddMetadata("authorization", absl::StrCat("Bearer ", token));
    call->stub = loom::v1::RankService::NewStub(coordinators_->channel());
    uint64_t id = 0;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) {
        id = 0;
      } else {
        id = next_id_++;
        in_flight_[id] = call;
        ++upstream_calls_;
      }
    }
    if (id == 0) {
      then(Stopping(), Response());
      return;
    }
    issue(*call->stub->async(), &call->context, &call->request, &call->response,
          [self = shared_from_this(), call, id, then = std::move(then)](grpc::Status status) mutable {
            self->coordinators_->Failed(status, &call->context);
            then(status, std::move(call->response));
            absl::MutexLock lock(&self->mu_);
            self->in_flight_.erase(id);
          });
  }

  // ---- sets and adds: StoreBatch ----
  // One rank's set or add, waiting for or riding in a batch.
  struct Op {
    std::string rank;     // RankKey, for Release
    loom::v1::StoreOp op;  // the rank's token and its set or add
    absl::Time give_up;   // a set is retried through UNAVAILABLE until then
    absl::Duration backoff;
    uint64_t lease_generation = 0;  // the lease generation it was admitted in
    SetDone set_done;     // exactly one of these is set
    AddDone add_done;
  };

  // Queues op; it goes at once (a batch of one) when no batch is in flight,
  // else with the next batch, when the one in flight returns.
  void Enqueue(Op op) {
    std::vector<Op> batch;
    std::vector<Op> fenced;
    bool refused = false;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) {
        ReleaseLocked(op.rank);
        refused = true;
      } else {
        queue_.push_back(std::move(op));
        if (!batch_busy_) {
          batch = TakeBatchLocked(&fenced);
          batch_busy_ = !batch.empty();
        }
      }
    }
    if (refused) {
      Answer(op, Stopping(), 0);
      return;
    }
    for (Op& each : fenced) Answer(each, Fenced(), 0);
    if (!batch.empty()) SendBatch(std::move(batch));
  }

  // The queue's first ops, up to the bounds of one StoreBatch. Ops that may
  // not go any more (the lease ran out since they came) leave the queue into
  // *fenced, released, to be answered outside the lock.
  std::vector<Op> TakeBatchLocked(std::vector<Op>* fenced) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<Op> batch;
    int64_t bytes = 0;
    const Lease::State lease = LeaseNow();
    while (!queue_.empty() && static_cast<int>(batch.size()) < rpc::kMaxStoreBatchOps) {
      if (!MayGo(queue_.front().lease_generation, lease)) {
        ReleaseLocked(queue_.front().rank);
        fenced->push_back(std::move(queue_.front()));
        queue_.pop_front();
        continue;
      }
      const loom::v1::StoreOp& next = queue_.front().op;
      const int64_t size = static_cast<int64_t>(next.set().key().size() +
                                                next.set().value().size() + next.add().key().size());
      if (!batch.empty() && bytes + size > rpc::kMaxStoreBatchBytes) break;
      bytes += size;
      batch.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    return batch;
  }

  void SendBatch(std::vector<Op> batch) {
    loom::v1::StoreBatchRequest request;
    request.mutable_ops()->Reserve(static_cast<int>(batch.size()));
    // A copy: a set that fails with UNAVAILABLE goes again.
    for (const Op& op : batch) *request.add_ops() = op.op;
    auto ops = std::make_shared<std::vector<Op>>(std::move(batch));
    Upstream<loom::v1::StoreBatchRequest, loom::v1::StoreBatchResponse>(
        /*token=*/"", std::move(request), absl::Now() + options_.unary_deadline,
        [](auto& stub, grpc::ClientContext* c, const auto* req, auto* resp, auto cb) {
          stub.StoreBatch(c, req, resp, std::move(cb));
        },
        [self = shared_from_this(), ops](grpc::Status status,
                                         loom::v1::StoreBatchResponse response) {
          self->BatchEnded(std::move(*ops), status, response);
        });
  }

  // Sends the next batch, then answers each op of the one that ended with
  // its own result (or the whole call's failure).
  void BatchEnded(std::vector<Op> ops, const grpc::Status& status,
                  const loom::v1::StoreBatchResponse& response) {
    std::vector<Op> next;
    std::vector<Op> refused;
    std::vector<Op> fenced;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) {
        for (Op& op : queue_) {
          ReleaseLocked(op.rank);
          refused.push_back(std::move(op));
        }
        queue_.clear();
      } else {
        next = TakeBatchLocked(&fenced);
      }
      batch_busy_ = !next.empty();
    }
    if (!next.empty()) SendBatch(std::move(next));
    for (Op& op : refused) Answer(op, Stopping(), 0);
    for (Op& op : fenced) Answer(op, Fenced(), 0);

    grpc::Status whole = status;
    if (whole.ok() && response.results_size() != static_cast<int>(ops.size())) {
      whole = grpc::Status(grpc::StatusCode::INTERNAL,
                           absl::StrCat("the coordinator answered a StoreBatch of ", ops.size(),
                                        " ops with ", response.results_size(), " results"));
    }
    if (!whole.ok() && stopping()) whole = Stopping();
    for (size_t i = 0; i < ops.size(); ++i) {
      if (!whole.ok()) {
        OpEnded(std::move(ops[i]), whole, 0);
        continue;
      }
      const loom::v1::StoreOpResult& result = response.results(static_cast<int>(i));
      OpEnded(std::move(ops[i]),
              grpc::Status(static_cast<grpc::StatusCode>(result.code()), result.message()),
              result.value());
    }
  }

  // A set that met UNAVAILABLE (a coordinator restarting or failing over)
  // goes again after a backoff until its time is up; an add never does.
  void OpEnded(Op op, const grpc::Status& status, int64_t value) {
    if (op.op.has_set() && status.error_code() == grpc::StatusCode::UNAVAILABLE &&
        absl::Now() + op.backoff <= op.give_up) {
      auto held = std::make_shared<Op>(std::move(op));
      const bool scheduled = Later(held->backoff, [self = shared_from_this(), held](bool fired) {
        if (!fired) {
          self->Release(held->rank);
          self->Answer(*held, Stopping(), 0);
          return;
        }
        held->backoff = std::min(held->backoff * 2, self->options_.max_backoff);
        self->Enqueue(std::move(*held));
      });
      if (scheduled) return;
      op = std::move(*held);
    }
    Release(op.rank);
    Answer(op, status, value);
  }

  static void Answer(Op& op, const grpc::Status& status, int64_t value) {
    if (op.set_done) op.set_done(status);
    if (op.add_done) op.add_done(status, value);
  }

  // ---- get ----
  void Get(const std::string& rank, const std::string& token, uint64_t lease_generation,
           const Key& key, absl::Time deadline, GetDone done) {
    bool issue = false;
    bool refused = false;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) {
        ReleaseLocked(rank);
        refused = true;
      } else {
        Group& group = groups_[key];
        const uint64_t id = next_id_++;
        Waiter& waiter = group.waiters[id];
        waiter.rank = rank;
        waiter.token = token;
        waiter.deadline = deadline;
        waiter.lease_generation = lease_generation;
        waiter.done = std::move(done);
        waiter.timer = timer_.After(deadline, [self = shared_from_this(), key, id](bool fired) {
          self->Expire(key, id, fired);
        });
        issue = !group.busy;
        group.busy = true;
      }
    }
    if (refused) {
      done(Stopping(), "");
      return;
    }
    if (issue) IssueGet(key, options_.initial_backoff);
  }

  void Expire(const Key& key, uint64_t id, bool fired) {
    GetDone done;
    {
      absl::MutexLock lock(&mu_);
      auto group = groups_.find(key);
      if (group == groups_.end()) return;
      auto waiter = group->second.waiters.find(id);
      if (waiter == group->second.waiters.end()) return;
      done = std::move(waiter->second.done);
      ReleaseLocked(waiter->second.rank);
      group->second.waiters.erase(waiter);
      if (group->second.waiters.empty() && !group->second.busy) groups_.erase(group);
    }
    // As the coordinator answers a get whose key did not appear in time.
    done(fired ? grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                              "the key was not set before the get's deadline")
               : Stopping(),
         "");
  }

  // Sends the group's upstream get, for its waiters that may still go (the
  // others are answered: fenced), with the token of the one that waits
  // longest, for as long as it waits.
  void IssueGet(const Key& key, absl::Duration backoff) {
    std::vector<GetDone> fenced;
    std::string token;
    absl::Time deadline = absl::InfinitePast();
    {
      absl::MutexLock lock(&mu_);
      auto found = groups_.find(key);
      if (found == groups_.end()) return;
      const Lease::State lease = LeaseNow();
      Group& group = found->second;
      for (auto it = group.waiters.begin(); it != group.waiters.end();) {
        Waiter& waiter = it->second;
        if (!MayGo(waiter.lease_generation, lease)) {
          timer_.Cancel(waiter.timer);
          ReleaseLocked(waiter.rank);
          fenced.push_back(std::move(waiter.done));
          it = group.waiters.erase(it);
          continue;
        }
        if (waiter.deadline > deadline) {
          deadline = waiter.deadline;
          token = waiter.token;
        }
        ++it;
      }
      if (group.waiters.empty()) groups_.erase(found);
    }
    for (GetDone& done : fenced) done(Fenced(), "");
    if (deadline == absl::InfinitePast()) return;  // nobody left to ask for
    loom::v1::StoreGetRequest request;
    request.set_store_namespace(key.first);
    request.set_key(key.second);
    request.set_wait_ms(
        absl::ToInt64Milliseconds(std::max(deadline - absl::Now(), absl::ZeroDuration())));
    Upstream<loom::v1::StoreGetRequest, loom::v1::StoreGetResponse>(
        token, std::move(request), deadline + options_.get_slack,
        [](auto& stub, grpc::ClientContext* c, const auto* req, auto* resp, auto cb) {
          stub.StoreGet(c, req, resp, std::move(cb));
        },
        [self = shared_from_this(), key, backoff](grpc::Status status,
                                                  loom::v1::StoreGetResponse response) {
          self->GetEnded(key, status, response.value(), backoff);
        });
  }

  // The upstream get for key ended: answer its waiters, or wait on for
  // those whose deadline has not passed.
  void GetEnded(const Key& key, const grpc::Status& status, const std::string& value,
                absl::Duration backoff) {
    std::vector<GetDone> answer;
    bool again = false;
    bool later = false;
    {
      absl::MutexLock lock(&mu_);
      auto found = groups_.find(key);
      if (found == groups_.end()) return;
      Group& group = found->second;
      group.busy = false;
      const absl::Time now = absl::Now();
      const bool retry = !stopping_ && (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                                        status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED);
      for (auto it = group.waiters.begin(); it != group.waiters.end();) {
        Waiter& waiter = it->second;
        if (!status.ok() && retry && waiter.deadline > now) {
          ++it;
          continue;
        }
        timer_.Cancel(waiter.timer);
        ReleaseLocked(waiter.rank);
        answer.push_back(std::move(waiter.done));
        it = group.waiters.erase(it);
      }
      if (group.waiters.empty()) {
        groups_.erase(found);
      } else {
        group.busy = true;
        again = true;
        // A coordinator that is restarting gets a moment; a wait that simply
        // ran out (a later waiter joined) goes again at once.
        later = status.error_code() == grpc::StatusCode::UNAVAILABLE;
      }
    }
    const grpc::Status answer_status = stopping() && !status.ok() ? Stopping() : status;
    for (GetDone& done : answer) done(answer_status, value);
    if (!again) return;
    if (!later) {
      IssueGet(key, options_.initial_backoff);
      return;
    }
    const bool scheduled = Later(backoff, [self = shared_from_this(), key, backoff](bool fired) {
      if (!fired) {
        self->GetEnded(key, Stopping(), "", backoff);
        return;
      }
      self->IssueGet(key, std::min(backoff * 2, self->options_.max_backoff));
    });
    if (!scheduled) GetEnded(key, Stopping(), "", backoff);
  }

  // Runs f after `delay` on the timer, unless the relay is stopping (false).
  bool Later(absl::Duration delay, CallbackTimer::Callback f) {
    absl::MutexLock lock(&mu_);
    if (stopping_) return false;
    timer_.After(absl::Now() + delay, std::move(f));
    return true;
  }

  void Shutdown() {
    std::vector<std::shared_ptr<CallBase>> calls;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      stopping_ = true;
      for (auto& [id, call] : in_flight_) calls.push_back(call);
    }
    // Outside the lock: a cancelled call's callback may run right here.
    for (auto& call : calls) call->context.TryCancel();
    calls.clear();
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](std::map<uint64_t, std::shared_ptr<CallBase>>* m) { return m->empty(); },
          &in_flight_));
    }
    timer_.Stop();  // answers the waiters and retries still pending
  }

  bool stopping() {
    absl::MutexLock lock(&mu_);
    return stopping_;
  }
  const StoreRelayOptions& options() const { return options_; }
  int64_t upstream_calls() {
    absl::MutexLock lock(&mu_);
    return upstream_calls_;
  }
  int pending() {
    absl::MutexLock lock(&mu_);
    return pending_;
  }

 private:
  struct Waiter {
    std::string rank;
    std::string token;
    absl::Time deadline;
    uint64_t lease_generation = 0;
    uint64_t timer = 0;
    GetDone done;
  };
  struct Group {
    std::map<uint64_t, Waiter> waiters;
    bool busy = false;  // an upstream get is in flight or about to be
  };

  void ReleaseLocked(const std::string& rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = per_rank_.find(rank);
    if (it != per_rank_.end() && --it->second <= 0) per_rank_.erase(it);
    --pending_;
  }

  const std::shared_ptr<rpc::CoordinatorChannel> coordinators_;
  const StoreRelayOptions options_;
  Lease* const lease_;
  absl::Mutex mu_;  // before the lease's: StoreRelay -> Lease, never back
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, int> per_rank_ ABSL_GUARDED_BY(mu_);
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t upstream_calls_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, std::shared_ptr<CallBase>> in_flight_ ABSL_GUARDED_BY(mu_);
  std::map<Key, Group> groups_ ABSL_GUARDED_BY(mu_);
  std::deque<Op> queue_ ABSL_GUARDED_BY(mu_);  // sets and adds waiting for a batch
  bool batch_busy_ ABSL_GUARDED_BY(mu_) = false;  // a batch is in flight or about to be
  CallbackTimer timer_;
};

StoreRelay::StoreRelay(std::shared_ptr<rpc::CoordinatorChannel> coordinators,
                       StoreRelayOptions options, Lease* lease)
    : impl_(std::make_shared<Impl>(std::move(coordinators), options, lease)) {}

StoreRelay::~StoreRelay() { impl_->Shutdown(); }

void StoreRelay::Shutdown() { impl_->Shutdown(); }

int64_t StoreRelay::upstream_calls() const { return impl_->upstream_calls(); }

int StoreRelay::pending() const { return impl_->pending(); }

namespace {
grpc::Status ToGrpc(const absl::Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}
}  // namespace

void StoreRelay::Set(const RankIdentity& rank, const std::string& token,
                     const loom::v1::StoreSetRequest& request, SetDone done) {
  if (absl::Status s = CheckStoreCall(rank, request.store_namespace(), request.key(),
                                      request.value().size());
      !s.ok()) {
    done(ToGrpc(s));
    return;
  }
  const std::string key = RankKey(rank);
  if (grpc::Status admitted = impl_->Admit(key); !admitted.ok()) {
    done(admitted);
    return;
  }
  Impl::Op op;
  op.rank = key;
  op.op.set_rank_token(token);
  *op.op.mutable_set() = request;
  op.give_up = absl::Now() + impl_->options().set_retry_for;
  op.backoff = impl_->options().initial_backoff;
  op.lease_generation = rank.lease_generation;
  op.set_done = std::move(done);
  impl_->Enqueue(std::move(op));
}

void StoreRelay::Get(const RankIdentity& rank, const std::string& token,
                     const loom::v1::StoreGetRequest& request, absl::Time deadline,
                     GetDone done) {
  if (absl::Status s = CheckStoreCall(rank, request.store_namespace(), request.key(), 0);
      !s.ok()) {
    done(ToGrpc(s), "");
    return;
  }
  const std::string key = RankKey(rank);
  if (grpc::Status admitted = impl_->Admit(key); !admitted.ok()) {
    done(admitted, "");
    return;
  }
  impl_->Get(key, token, rank.lease_generation, Key{request.store_namespace(), request.key()},
             deadline, std::move(done));
}

void StoreRelay::Add(const RankIdentity& rank, const std::string& token,
                     const loom::v1::StoreAddRequest& request, AddDone done) {
  if (absl::Status s = CheckStoreCall(rank, request.store_namespace(), request.key(), 0);
      !s.ok()) {
    done(ToGrpc(s), 0);
    return;
  }
  const std::string key = RankKey(rank);
  if (grpc::Status admitted = impl_->Admit(key); !admitted.ok()) {
    done(admitted, 0);
    return;
  }
  Impl::Op op;
  op.rank = key;
  op.op.set_rank_token(token);
  *op.op.mutable_add() = request;
  op.lease_generation = rank.lease_generation;
  op.add_done = std::move(done);
  impl_->Enqueue(std::move(op));
}

}  // namespace loom::agent
