#include "tools/loadgen/fake_cluster.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/rpc/rpc_settings.h"
#include "common/rpc/store_quotas.h"
#include "grpcpp/grpcpp.h"
#include "loom/v1/node.grpc.pb.h"
#include "loom/v1/rank.grpc.pb.h"

namespace loom::loadgen {
namespace {

using loom::v1::RankAssignment;
using loom::v1::RankProgress;

constexpr int kMaxErrorsLogged = 10;
std::atomic<int> errors_logged{0};

void LogError(const std::string& what) {
  if (errors_logged.fetch_add(1) < kMaxErrorsLogged) {
    std::fprintf(stderr, "loom-loadgen: %s\n", what.c_str());
  }
}

// One unary RankService call with the rank's token; deleted by its callback.
template <typename Request, typename Response>
struct UnaryCall {
  UnaryCall(const std::string& token, absl::Duration timeout) : start(absl::Now()) {
    context.AddMetadata("authorization", absl::StrCat("Bearer ", token));
    context.set_deadline(absl::ToChronoTime(start + timeout));
  }
  grpc::ClientContext context;
  Request request;
  Response response;
  absl::Time start;
};

}  // namespace

class FakeRank;

// The node agent's sharing of its ranks' waiting gets (worker/agent/
// store_relay.h): one StoreGet per (namespace, key) for all of the node's
// ranks that wait on it, answered to each of them.
class NodeGets {
 public:
  NodeGets(loom::v1::RankService::Stub* stub, FakeCluster::Shared* shared)
      : stub_(stub), shared_(shared) {}

  // rank waits for key; its Joined() runs when the value comes.
  void Wait(FakeRank* rank, const std::string& store_namespace, const std::string& key,
            const std::string& token);
  // Cancels the shared gets none of whose ranks is alive any more (all
  // true: every one, at shutdown).
  void CancelAbandoned(bool all);

 private:
  using Call = UnaryCall<loom::v1::StoreGetRequest, loom::v1::StoreGetResponse>;
  struct Shared {
    Call* call = nullptr;
    std::vector<FakeRank*> waiters;
  };
  void Ended(const std::pair<std::string, std::string>& id, Call* call,
             const grpc::Status& status);

  loom::v1::RankService::Stub* const stub_;
  FakeCluster::Shared* const shared_;
  std::mutex mu_;
  std::map<std::pair<std::string, std::string>, Shared> gets_;
};

// The node agent's batching of its ranks' sets and adds (worker/agent/
// store_relay.h): with no StoreBatch in flight an op goes at once; while one
// is, later ops queue and go together when it returns. The follow-up ops a
// batch's answers cause (a rank's add after its set) queue before the next
// batch goes, so a node's ranks that act together share their batches.
class NodeWrites {
 public:
  // done runs once with the op's status and, for an add, its value.
  using Done = std::function<void(const grpc::Status&, int64_t value)>;
  NodeWrites(loom::v1::RankService::Stub* stub, FakeCluster::Shared* shared)
      : stub_(stub), shared_(shared) {}

  void Send(loom::v1::StoreOp op, Done done);
  // Cancels the batch in flight (shutdown).
  void CancelAll();

 private:
  struct Batch {
    grpc::ClientContext context;
    loom::v1::StoreBatchRequest request;
    loom::v1::StoreBatchResponse response;
    std::vector<Done> done;
    absl::Time start;
  };
  // Takes the queue as the next batch (mu_ held); nullptr when it is empty.
  Batch* TakeLocked();
  void Issue(Batch* batch);
  void Ended(Batch* batch, const grpc::Status& status);

  loom::v1::RankService::Stub* const stub_;
  FakeCluster::Shared* const shared_;
  std::mutex mu_;
  std::vector<std::pair<loom::v1::StoreOp, Done>> queue_;
  Batch* in_flight_ = nullptr;
  bool busy_ = false;  // a batch is in flight or its answers are being handled
};

// One rank of a launched attempt: its rendezvous through the store (with its
// rank token, as its agent relays a trainer's calls; the waiting get goes
// through its node's NodeGets), then its reports, which its node sends in
// its batches (FillReady, FillStep) as the agent forwards a trainer's.
class FakeRank {
 public:
  // kLaunched -> kJoining (rendezvous calls) -> kJoined (left the barrier,
  // "ready" not yet in a batch) -> kReporting; kStopped at any point (killed).
  enum State : int { kLaunched, kJoining, kJoined, kReporting, kStopped };

  FakeRank(RankAssignment assignment, FakeCluster::Shared* shared,
           std::atomic<bool>* ready_pending, NodeGets* node_gets, NodeWrites* node_writes)
      : a_(Keep(std::move(assignment))), shared_(shared), ready_pending_(ready_pending),
        node_gets_(node_gets), node_writes_(node_writes) {}

  const std::string& job_id() const { return a_.job_id(); }
  int32_t attempt() const { return a_.attempt(); }
  int32_t rank() const { return a_.rank(); }
  State state() const { return state_.load(std::memory_order_acquire); }
  bool alive() const { return state() != kStopped; }

  // Starts the rendezvous once at (or after) start_at: real trainers take a
  // while to start, so their first calls spread out (--rank_start_spread_s).
  void set_start_at(absl::Time at) { start_at_ = at; }
  void MaybeBegin(absl::Time now) {
    if (state() == kLaunched && now >= start_at_) Begin();
  }

  void Begin() {
    State expected = kLaunched;
    if (!state_.compare_exchange_strong(expected, kJoining)) return;
    loom::v1::StoreOp op = Op();
    loom::v1::StoreSetRequest* set = op.mutable_set();
    set->set_key(absl::StrCat("loadgen/addr/", a_.rank()));
    set->set_value(absl::StrCat("127.0.0.1:", 20000 + a_.local_device()));
    Write(std::move(op), "StoreSet", [this](int64_t) { Join(); });
  }

  // The node's batch builder (one thread at a time, under the node's lock)
  // writes this rank's report into a reused, cleared message: no allocation
  // once the message's strings and groups exist.
  // "ready": the rank left the barrier. Moves it to kReporting.
  void FillReady(RankProgress* m, int64_t now_us) {
    m->set_job_id(a_.job_id());
    m->set_attempt(a_.attempt());
    m->set_rank(a_.rank());
    m->set_phase("ready");
    m->set_time_unix_ms(now_us / 1000);
    m->set_time_unix_us(now_us);  // as loom-trainer stamps it
    State expected = kJoined;
    state_.compare_exchange_strong(expected, kReporting);
  }

  // A healthy rank completes a step a second; once a peer is stopped
  // (stopped_since_ms > 0), the others wait in the data-parallel all-reduce
  // of the next step.
  void FillStep(RankProgress* m, int64_t now_us, int64_t stopped_since_ms) {
    m->set_job_id(a_.job_id());
    m->set_attempt(a_.attempt());
    m->set_rank(a_.rank());
    m->set_time_unix_ms(now_us / 1000);
    m->set_time_unix_us(now_us);  // as loom-trainer stamps it
    if (stopped_since_ms <= 0) {
      ++step_;
      m->set_phase("step");
      m->set_step(step_);
      m->set_loss(5.0 / static_cast<double>(step_));
      m->set_tokens(step_ * 4096 * static_cast<int64_t>(a_.world_size()));
      m->set_step_seconds(1.0);
      m->set_tokens_per_second(4096.0 * a_.world_size());
      m->set_memory_bytes(int64_t{40} << 30);
      m->set_flops_per_token(6e9);
      m->set_lr(3e-4);
      m->set_grad_norm(1.0);
      return;
    }
    m->set_phase("forward_backward");
    m->set_step(step_);
    m->set_micro_batch(0);
    m->set_phase_since_unix_ms(stopped_since_ms);
    loom::v1::GroupProgress* group = m->add_groups();
    group->set_group("dp");
    group->set_issued(step_ + 1);
    group->set_completed(step_);
    group->set_current_op("all_reduce");
    group->set_current_since_unix_ms(stopped_since_ms);
  }

  // KillRanks (the trainer dies) or the load generator's shutdown: no more
  // reports; the answer of a write in flight is ignored.
  void Stop() { state_.store(kStopped, std::memory_order_release); }

 private:
  // A store op with this rank's token and namespace (set or add to fill in).
  loom::v1::StoreOp Op() const {
    loom::v1::StoreOp op;
    op.set_rank_token(a_.rank_token());
    return op;
  }
  // Sends op in the node's next StoreBatch; then runs with an add's value
  // when it succeeded and the rank goes on.
  void Write(loom::v1::StoreOp op, const char* what, std::function<void(int64_t)> then) {
    if (!alive() || shared_->shutting_down.load()) return;
    if (op.has_set()) op.mutable_set()->set_store_namespace(a_.store_namespace());
    if (op.has_add()) op.mutable_add()->set_store_namespace(a_.store_namespace());
    node_writes_->Send(std::move(op), [this, what, then = std::move(then)](
                                          const grpc::Status& status, int64_t value) {
      if (!status.ok()) {
        if (!alive() || shared_->shutting_down.load()) return;
        shared_->stats->rendezvous_failed++;
        LogError(absl::StrCat("rank ", a_.rank(), " ", what, ": ", status.error_message()));
        return;
      }
      if (alive()) then(value);
    });
  }

  void Join() {
    loom::v1::StoreOp op = Op();
    op.mutable_add()->set_key("loadgen/joined");
    op.mutable_add()->set_delta(1);
    Write(std::move(op), "StoreAdd", [this](int64_t joined) {
      if (joined == a_.world_size()) {
        Release();
      } else {
        WaitForAll();
      }
    });
  }

  // The last rank to join opens the barrier.
  void Release() {
    loom::v1::StoreOp op = Op();
    op.mutable_set()->set_key("loadgen/go");
    op.mutable_set()->set_value("1");
    Write(std::move(op), "StoreSet go", [this](int64_t) { Joined(); });
  }

  void WaitForAll() {
    if (!alive() || shared_->shutting_down.load()) return;
    node_gets_->Wait(this, a_.store_namespace(), "loadgen/go", a_.rank_token());
  }

 public:
  // Out of the barrier: the node's next tick sends this rank's "ready".
  void Joined() {
    State expected = kJoining;
    if (state_.compare_exchange_strong(expected, kJoined)) ready_pending_->store(true);
  }
  void RendezvousFailed(const std::string& what) {
    if (!alive() || shared_->shutting_down.load()) return;
    shared_->stats->rendezvous_failed++;
    LogError(absl::StrCat("rank ", a_.rank(), " ", what));
  }

 private:

  // What a rank needs of its assignment: 16,384 copies of a data-parallel
  // group's member list would be 1 GiB of the load generator's own memory.
  static RankAssignment Keep(RankAssignment a) {
    a.clear_groups();
    a.clear_spec_yaml();
    a.clear_pipeline_instructions();
    a.clear_layers();
    return a;
  }

  absl::Time start_at_ = absl::InfinitePast();
  std::atomic<State> state_{kLaunched};
  int64_t step_ = 0;  // the node's batch builder's only

  const RankAssignment a_;
  FakeCluster::Shared* const shared_;
  std::atomic<bool>* const ready_pending_;  // the node's
  NodeGets* const node_gets_;               // the node's
  NodeWrites* const node_writes_;           // the node's
};

void NodeGets::Wait(FakeRank* rank, const std::string& store_namespace, const std::string& key,
                    const std::string& token) {
  Call* call = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Shared& get = gets_[{store_namespace, key}];
    get.waiters.push_back(rank);
    if (get.call != nullptr) return;  // one is in flight: this rank shares it
    call = new Call(token, absl::Seconds(600));
    call->request.set_store_namespace(store_namespace);
    call->request.set_key(key);
    call->request.set_wait_ms(590'000);
    get.call = call;
  }
  stub_->async()->StoreGet(&call->context, &call->request, &call->response,
                           [this, id = std::pair{store_namespace, key}, call](grpc::Status status) {
                             Ended(id, call, status);
                           });
}

void NodeGets::Ended(const std::pair<std::string, std::string>& id, Call* call,
                     const grpc::Status& status) {
  std::vector<FakeRank*> waiters;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = gets_.find(id);
    if (it != gets_.end() && it->second.call == call) {
      waiters.swap(it->second.waiters);
      gets_.erase(it);
    }
  }
  for (FakeRank* rank : waiters) {
    if (status.ok()) {
      rank->Joined();
    } else {
      rank->RendezvousFailed(absl::StrCat("StoreGet go: ", status.error_message()));
    }
  }
  delete call;
}

void NodeGets::CancelAbandoned(bool all) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, get] : gets_) {
    const bool abandoned = std::none_of(get.waiters.begin(), get.waiters.end(),
                                        [](FakeRank* rank) { return rank->alive(); });
    if ((all || abandoned) && get.call != nullptr) get.call->context.TryCancel();
  }
}

void NodeWrites::Send(loom::v1::StoreOp op, Done done) {
  Batch* batch = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.emplace_back(std::move(op), std::move(done));
    if (busy_) return;  // goes with the next batch
    busy_ = true;
    batch = TakeLocked();
  }
  Issue(batch);
}

NodeWrites::Batch* NodeWrites::TakeLocked() {
  if (queue_.empty()) return nullptr;
  auto* batch = new Batch;
  const size_t n = std::min<size_t>(queue_.size(), rpc::kMaxStoreBatchOps);
  for (size_t i = 0; i < n; ++i) {
    *batch->request.add_ops() = std::move(queue_[i].first);
    batch->done.push_back(std::move(queue_[i].second));
  }
  queue_.erase(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(n));
  return batch;
}

void NodeWrites::Issue(Batch* batch) {
  batch->start = absl::Now();
  shared_->stats->store_batches++;
  batch->context.set_deadline(absl::ToChronoTime(batch->start + absl::Seconds(30)));
  {
    std::lock_guard<std::mutex> lock(mu_);
    in_flight_ = batch;
  }
  stub_->async()->StoreBatch(&batch->context, &batch->request, &batch->response,
                             [this, batch](grpc::Status status) { Ended(batch, status); });
}

void NodeWrites::Ended(Batch* batch, const grpc::Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    in_flight_ = nullptr;
  }
  // Each op is timed as the batch that carried it.
  const absl::Duration took = absl::Now() - batch->start;
  const bool whole = status.ok() && batch->response.results_size() == batch->request.ops_size();
  for (size_t i = 0; i < batch->done.size(); ++i) {
    grpc::Status op_status = status;
    int64_t value = 0;
    if (whole) {
      const loom::v1::StoreOpResult& r = batch->response.results(static_cast<int>(i));
      op_status = grpc::Status(static_cast<grpc::StatusCode>(r.code()), r.message());
      value = r.value();
    } else if (status.ok()) {
      op_status = grpc::Status(grpc::StatusCode::INTERNAL, "StoreBatch answered the wrong count");
    }
    if (!shared_->shutting_down.load()) {
      if (op_status.ok()) {
        shared_->stats->store_latency.Record(took);
      } else {
        shared_->stats->store_latency.RecordFailure();
      }
    }
    batch->done[i](op_status, value);  // may queue the rank's next op
  }
  delete batch;
  Batch* next = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    next = shared_->shutting_down.load() ? nullptr : TakeLocked();
    busy_ = next != nullptr;
    if (next == nullptr) queue_.clear();  // shutting down, or nothing left
  }
  if (next != nullptr) Issue(next);
}

void NodeWrites::CancelAll() {
  std::lock_guard<std::mutex> lock(mu_);
  if (in_flight_ != nullptr) in_flight_->context.TryCancel();
}

// One node agent's session. Its writes go one at a time (gRPC allows one in
// flight), in this order: the heartbeat, then exits (outbox_), then the
// progress batch. The heartbeat and the batch are reused messages, each
// queued at most once.
class FakeNode final
    : public grpc::ClientBidiReactor<loom::v1::NodeMessage, loom::v1::CoordinatorMessage> {
 public:
  FakeNode(std::string id, int gpus, std::shared_ptr<grpc::Channel> channel,
           FakeCluster::Shared* shared)
      : id_(std::move(id)),
        gpus_(gpus),
        node_stub_(loom::v1::NodeService::NewStub(channel)),
        rank_stub_(loom::v1::RankService::NewStub(channel)),
        shared_(shared),
        node_gets_(rank_stub_.get(), shared),
        node_writes_(rank_stub_.get(), shared) {}

  void Start() {
    node_stub_->async()->Session(&context_, this);
    AddHold();
    StartRead(&in_);
    loom::v1::NodeMessage message;
    loom::v1::RegisterNode* r = message.mutable_register_();
    r->set_node_id(id_);
    r->set_hostname(id_);
    r->set_address("127.0.0.1");
    loom::v1::Device* d = r->add_devices();
    d->set_kind("gpu");
    d->set_count(gpus_);
    d->set_name("NVIDIA H200");
    d->set_memory_bytes(int64_t{143771} << 20);
    d->set_peak_flops(989e12);
    Send(std::move(message));
    StartCall();
  }

  bool registered() const {
    std::lock_guard<std::mutex> lock(mu_);
    return registered_;
  }

  // The heartbeat is one reused message too; only while the previous one is
  // still queued (loadgen lagging) does a new one queue behind it.
  void Heartbeat() {
    bool write_now = false;
    loom::v1::NodeMessage spare;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!registered_ || ended_) return;
      loom::v1::NodeMessage* beat = heartbeat_busy_ ? &spare : &heartbeat_;
      loom::v1::Heartbeat* h = beat->mutable_heartbeat();
      h->set_seq(++seq_);
      // As loom-worker does: the coordinator measures how late it reads
      // heartbeats from this (this includes loadgen's own queueing).
      h->set_sent_monotonic_us(std::chrono::duration_cast<std::chrono::microseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
      h->mutable_running()->Clear();  // keeps the entries for reuse
      for (const auto& rank : ranks_) {
        if (!rank->alive()) continue;
        loom::v1::RunningRank* r = h->mutable_running()->Add();
        r->set_job_id(rank->job_id());
        r->set_attempt(rank->attempt());
        r->set_rank(rank->rank());
        r->set_pid(100000 + rank->rank());
      }
      const absl::Time now = absl::Now();
      if (beat == &spare) {
        outbox_.emplace_back(std::move(spare), now);  // a write is in flight
        return;
      }
      heartbeat_busy_ = true;
      heartbeat_queued_at_ = now;
      if (writing_) {
        heartbeat_queued_ = true;
      } else {
        writing_ = true;
        in_flight_ = &heartbeat_;
        write_now = true;
      }
    }
    if (write_now) StartWrite(&heartbeat_);
  }

  // True once per round of ranks that left their barrier since it was last
  // taken (set from gRPC callbacks, taken by the report thread).
  bool TakeReadyPending() {
    return ready_pending_.load(std::memory_order_relaxed) && ready_pending_.exchange(false);
  }

  // Sends this node's progress batch: with full (the 1 Hz tick) one report
  // per reporting rank and any new "ready"; without, only the new "ready"s.
  // The stopped rank is left out (it is silent); with a stopped rank the
  // others report waiting for it. A full batch due while the previous one is
  // still queued is skipped and counted.
  void SendBatch(bool full, absl::Time now) {
    bool write_now = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!registered_ || ended_) return;
      if (shared_->rank_start_spread_s > 0) {
        for (const auto& rank : ranks_) rank->MaybeBegin(now);
      }
      const int stopped = shared_->stopped_rank.load(std::memory_order_relaxed);
      if (batch_busy_) {
        if (!full) {
          ready_pending_ = true;  // retried on the next tick
          return;
        }
        int64_t skipped = 0;
        for (const auto& rank : ranks_) {
          const FakeRank::State state = rank->state();
          if (state == FakeRank::kJoined ||
              (state == FakeRank::kReporting && rank->rank() != stopped)) {
            ++skipped;
          }
        }
        if (skipped > 0) {
          shared_->stats->reports_skipped += skipped;
          shared_->stats->batches_skipped++;
        }
        return;
      }
      const int64_t now_us = absl::ToUnixMicros(now);
      const int64_t stopped_since = stopped >= 0 ? shared_->stopped_at_ms.load() : 0;
      auto* reports = batch_.mutable_progress()->mutable_reports();
      reports->Clear();  // keeps the messages for reuse
      batch_ready_ = 0;
      for (const auto& rank : ranks_) {
        const FakeRank::State state = rank->state();
        if (state == FakeRank::kJoined) {
          rank->FillReady(reports->Add(), now_us);
          ++batch_ready_;
        } else if (full && state == FakeRank::kReporting && rank->rank() != stopped) {
          rank->FillStep(reports->Add(), now_us, stopped_since);
        }
      }
      if (reports->empty()) return;
      batch_busy_ = true;
      if (writing_) {
        batch_queued_ = true;
      } else {
        writing_ = true;
        in_flight_ = &batch_;
        write_now = true;
      }
    }
    if (write_now) StartWrite(&batch_);
  }

  void Cancel() {
    std::vector<FakeRank*> ranks;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& rank : ranks_) ranks.push_back(rank.get());
    }
    for (FakeRank* rank : ranks) rank->Stop();
    node_gets_.CancelAbandoned(/*all=*/true);
    node_writes_.CancelAll();
    context_.TryCancel();
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        ended_ = true;
      }
      if (!shared_->shutting_down.load()) {
        shared_->stats->sessions_ended++;
        LogError(absl::StrCat("node ", id_, ": session ended"));
      }
      ReleaseHold();
      return;
    }
    if (in_.has_registered()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!registered_) shared_->stats->sessions_registered++;
      registered_ = true;
    } else if (in_.has_launch()) {
      shared_->stats->launches++;
      auto rank = std::make_unique<FakeRank>(in_.launch().assignment(), shared_, &ready_pending_,
                                             &node_gets_, &node_writes_);
      FakeRank* raw = rank.get();
      const double spread = shared_->rank_start_spread_s;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (spread > 0) raw->set_start_at(absl::Now() + absl::Seconds(spread * uniform_(random_)));
        ranks_.push_back(std::move(rank));
      }
      if (spread <= 0) raw->Begin();
    } else if (in_.has_kill()) {
      shared_->stats->kills++;
      Kill(in_.kill());
    }
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override {
    loom::v1::NodeMessage* next = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (in_flight_ == &batch_) {
        batch_busy_ = false;
        if (ok) {
          shared_->stats->reports_sent += batch_.progress().reports_size();
          shared_->stats->batches_sent++;
          shared_->stats->ranks_ready += batch_ready_;
        }
      } else if (in_flight_ == &heartbeat_) {
        heartbeat_busy_ = false;
        if (ok) shared_->stats->heartbeat_delay.Record(absl::Now() - heartbeat_queued_at_);
      } else if (ok && out_.has_heartbeat()) {
        shared_->stats->heartbeat_delay.Record(absl::Now() - out_queued_);
      }
      if (!ok) {
        ended_ = true;
        writing_ = false;
        in_flight_ = nullptr;
        outbox_.clear();
        heartbeat_queued_ = false;
        heartbeat_busy_ = false;
        batch_queued_ = false;
        batch_busy_ = false;
        return;
      }
      if (heartbeat_queued_) {
        heartbeat_queued_ = false;
        next = &heartbeat_;
      } else if (!outbox_.empty()) {
        out_ = std::move(outbox_.front().first);
        out_queued_ = outbox_.front().second;
        outbox_.pop_front();
        next = &out_;
      } else if (batch_queued_) {
        batch_queued_ = false;
        next = &batch_;
      }
      in_flight_ = next;
      writing_ = next != nullptr;
    }
    if (next != nullptr) StartWrite(next);
  }

  void OnDone(const grpc::Status& status) override {
    std::lock_guard<std::mutex> lock(mu_);
    ended_ = true;
    if (!status.ok() && !shared_->shutting_down.load()) {
      LogError(absl::StrCat("node ", id_, ": session status: ", status.error_message()));
    }
  }

 private:
  void Send(loom::v1::NodeMessage message) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (ended_) return;
      if (writing_) {
        outbox_.emplace_back(std::move(message), absl::Now());
        return;
      }
      writing_ = true;
      out_ = std::move(message);
      out_queued_ = absl::Now();
      in_flight_ = &out_;
    }
    StartWrite(&out_);
  }

  void Kill(const loom::v1::KillRanks& kill) {
    std::vector<FakeRank*> victims;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& rank : ranks_) {
        if (rank->job_id() == kill.job_id() &&
            (kill.attempt() == 0 || kill.attempt() == rank->attempt()) && rank->alive()) {
          victims.push_back(rank.get());
        }
      }
    }
    for (FakeRank* rank : victims) {
      rank->Stop();
      loom::v1::NodeMessage message;
      loom::v1::RankExited* e = message.mutable_rank_exited();
      e->set_job_id(rank->job_id());
      e->set_attempt(rank->attempt());
      e->set_rank(rank->rank());
      e->set_signal(15);
      Send(std::move(message));
    }
    node_gets_.CancelAbandoned(/*all=*/false);
  }

  void ReleaseHold() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (hold_released_) return;
      hold_released_ = true;
    }
    RemoveHold();
  }

  const std::string id_;
  const int gpus_;
  std::unique_ptr<loom::v1::NodeService::Stub> node_stub_;
  std::unique_ptr<loom::v1::RankService::Stub> rank_stub_;
  FakeCluster::Shared* const shared_;
  NodeGets node_gets_;  // its ranks' shared waiting gets
  NodeWrites node_writes_;  // its ranks' sets and adds, in StoreBatch calls
  grpc::ClientContext context_;
  loom::v1::CoordinatorMessage in_;
  std::atomic<bool> ready_pending_{false};

  mutable std::mutex mu_;
  loom::v1::NodeMessage heartbeat_;  // the heartbeat, reused every second
  absl::Time heartbeat_queued_at_;   // for the heartbeat delay
  bool heartbeat_busy_ = false;      // heartbeat_ queued or being written
  bool heartbeat_queued_ = false;    // heartbeat_ waits for the write in flight
  loom::v1::NodeMessage out_;   // the exit (or spare heartbeat) being written
  absl::Time out_queued_;       // when out_ was queued, for the heartbeat delay
  loom::v1::NodeMessage batch_;  // the progress batch, reused every second
  int batch_ready_ = 0;          // its "ready" reports
  bool batch_busy_ = false;      // batch_ queued or being written
  bool batch_queued_ = false;    // batch_ waits for the write in flight
  loom::v1::NodeMessage* in_flight_ = nullptr;
  std::deque<std::pair<loom::v1::NodeMessage, absl::Time>> outbox_;
  std::vector<std::unique_ptr<FakeRank>> ranks_;
  bool writing_ = false;
  bool registered_ = false;
  bool ended_ = false;
  bool hold_released_ = false;
  int64_t seq_ = 0;
  std::mt19937 random_{std::random_device{}()};
  std::uniform_real_distribution<double> uniform_{0.0, 1.0};
};

FakeCluster::FakeCluster(ClusterOptions options, NodeCertFactory* certs)
    : options_(std::move(options)), certs_(certs) {
  shared_.stats = &stats_;
  shared_.rank_start_spread_s = options_.rank_start_spread_s;
}

// The nodes and ranks are left to the process's exit: gRPC may still hold
// them after a bounded Shutdown, and freeing them then would be a use after free.
FakeCluster::~FakeCluster() {
  for (auto& node : nodes_) node.release();
}

absl::Status FakeCluster::Create() {
  for (int i = 0; i < options_.nodes; ++i) {
    const std::string id = absl::StrFormat("%s-%05d", options_.node_prefix, i);
    std::shared_ptr<grpc::ChannelCredentials> credentials;
    if (options_.insecure) {
      credentials = grpc::InsecureChannelCredentials();
    } else {
      absl::StatusOr<PemIdentity> identity = certs_->Issue(id);
      if (!identity.ok()) return identity.status();
      grpc::SslCredentialsOptions ssl;
      ssl.pem_root_certs = identity->ca_pem;
      ssl.pem_cert_chain = identity->cert_pem;
      ssl.pem_private_key = identity->key_pem;
      credentials = grpc::SslCredentials(ssl);
    }
    auto node = std::make_unique<FakeNode>(id, options_.gpus_per_node,
                                           rpc::MakeChannel(options_.coordinator, credentials),
                                           &shared_);
    nodes_.push_back(std::move(node));
  }
  return absl::OkStatus();
}

absl::Status FakeCluster::Connect(absl::Duration timeout) {
  for (auto& node : nodes_) node->Start();
  const absl::Time deadline = absl::Now() + timeout;
  while (stats_.sessions_registered.load() < options_.nodes) {
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          stats_.sessions_registered.load(), " of ", options_.nodes, " nodes registered within ",
          absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::OkStatus();
}

void FakeCluster::TickHeartbeats(int slice, int slices) {
  for (size_t i = static_cast<size_t>(slice); i < nodes_.size(); i += static_cast<size_t>(slices)) {
    nodes_[i]->Heartbeat();
  }
}

void FakeCluster::TickReports(int slice, int slices) {
  const absl::Time now = absl::Now();
  for (size_t i = static_cast<size_t>(slice); i < nodes_.size(); i += static_cast<size_t>(slices)) {
    nodes_[i]->SendBatch(/*full=*/true, now);
  }
  for (auto& node : nodes_) {
    if (node->TakeReadyPending()) node->SendBatch(/*full=*/false, now);
  }
}

void FakeCluster::StopRank(int rank) {
  shared_.stopped_at_ms = absl::ToUnixMillis(absl::Now());
  shared_.stopped_rank = rank;
}

void FakeCluster::Shutdown() {
  shared_.shutting_down = true;
  for (auto& node : nodes_) node->Cancel();
  absl::SleepFor(absl::Milliseconds(500));  // let the cancellations reach the coordinator
}

}  // namespace loom::loadgen
