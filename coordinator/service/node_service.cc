#include "coordinator/service/node_service.h"

#include <cstdio>
#include <deque>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/text/safe_text.h"
#include "coordinator/auth/policy.h"
#include "coordinator/service/metrics.h"
#include "coordinator/service/status_convert.h"

namespace loom::coordinator {
namespace {

using loom::v1::CoordinatorMessage;
using loom::v1::NodeMessage;

class SessionReactor;

// What the registry holds for a live node: a handle that forwards commands to
// the session while it lasts and drops them after.
class SessionChannel final : public NodeChannel {
 public:
  // With a liveness port, each session gets a grant of its own.
  SessionChannel(SessionReactor* reactor, bool liveness) : reactor_(reactor) {
    if (liveness) grant_ = liveness::NewGrant();
  }
  void Send(const CoordinatorMessage& message) override;
  const liveness::Grant* liveness_grant() const override {
    return grant_.has_value() ? &*grant_ : nullptr;
  }
  void Detach() {
    absl::MutexLock lock(&mu_);
    reactor_ = nullptr;
  }

 private:
  std::optional<liveness::Grant> grant_;
  absl::Mutex mu_;
  SessionReactor* reactor_ ABSL_GUARDED_BY(mu_);
};

class SessionReactor final : public grpc::ServerBidiReactor<NodeMessage, CoordinatorMessage> {
 public:
  SessionReactor(NodeServiceImpl* service, NodeRegistry* nodes, JobManager* jobs,
                 absl::Duration heartbeat_interval, absl::StatusOr<auth::Identity> caller)
      : service_(service),
        nodes_(nodes),
        jobs_(jobs),
        heartbeat_interval_(heartbeat_interval),
        channel_(std::make_shared<SessionChannel>(this, service->liveness_port() > 0)),
        caller_(std::move(caller)) {
    if (!caller_.ok()) {
      absl::MutexLock lock(&mu_);
      FinishLocked(ToGrpc(caller_.status()));
      return;
    }
    StartRead(&incoming_);
  }

  void Enqueue(const CoordinatorMessage& message) {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    outgoing_.push_back(message);
    if (!writing_) WriteNextLocked();
  }

  // Acks are cumulative (the agent's lease runs from the newest acked
  // heartbeat): while one waits to be written, a newer heartbeat's seq takes
  // its place, so an agent that sends and never reads cannot grow the queue.
  void EnqueueAck(int64_t seq) {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    ack_seq_ = seq;
    if (ack_queued_) return;
    ack_queued_ = true;
    CoordinatorMessage ack;
    ack.mutable_heartbeat_ack();
    outgoing_.push_back(std::move(ack));
    if (!writing_) WriteNextLocked();
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      absl::MutexLock lock(&mu_);
      FinishLocked(grpc::Status::OK);
      return;
    }
    // Any message proves the agent alive; while this one is handled (it may
    // wait for the job table) nothing else is read from the node, and the
    // registry does not count that time as the node's silence.
    if (!node_id_.empty()) nodes_->MessageRead(node_id_, channel_.get(), absl::Now());
    const absl::Status handled = Handle(incoming_);
    if (!node_id_.empty()) nodes_->MessageHandled(node_id_, channel_.get(), absl::Now());
    if (!handled.ok()) {
      absl::MutexLock lock(&mu_);
      FinishLocked(ToGrpc(handled));
      return;
    }
    StartRead(&incoming_);
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) {
      FinishLocked(grpc::Status(grpc::StatusCode::UNAVAILABLE, "node session broke"));
      return;
    }
    WriteNextLocked();
  }

  void OnDone() override {
    channel_->Detach();
    if (!node_id_.empty() && nodes_->SessionClosed(node_id_, channel_.get())) {
      // Not lost yet: a node is lost once silent for the node timeout (the
      // liveness tick), so a transient break costs nothing, and a node whose
      // agent is gone is lost only when its lease has run out and its ranks
      // are paused (docs/fault_tolerance.md, "Fencing").
      if (jobs_->Acting()) {
        std::fprintf(stderr,
                     "node %s: session ended; lost unless its agent registers again within %s "
                     "of its last heartbeat\n",
                     node_id_.c_str(), absl::FormatDuration(service_->node_timeout()).c_str());
      } else {
        std::fprintf(stderr, "node %s: session ended (this coordinator is stopping)\n",
                     node_id_.c_str());
      }
    }
    delete this;
  }

 private:
  // An error ends the session with that status.
  absl::Status Handle(const NodeMessage& message) {
    switch (message.kind_case()) {
      case NodeMessage::kRegister: {
        const std::string& node_id = message.register_().node_id();
        if (absl::Status s = CheckRegistration(message.register_(), service_->node_limits());
            !s.ok()) {
          std::fprintf(stderr, "a node session was refused: %s\n", std::string(s.message()).c_str());
          return s;
        }
        if (!node_id_.empty() && node_id != node_id_) {
          return absl::PermissionDeniedError("a session registers one node id");
        }
        if (absl::Status s = auth::AuthorizeRegister(*caller_, node_id); !s.ok()) return s;
        if (node_id_.empty() &&
            !nodes_->RegisterIfFree(message.register_(), channel_, absl::Now(),
                                    2 * heartbeat_interval_)) {
          return absl::PermissionDeniedError(absl::StrCat(
              "node ", node_id, " already has a live session; a second one is refused"));
        }
        if (!node_id_.empty()) nodes_->Register(message.register_(), channel_, absl::Now());
        node_id_ = node_id;
        registration_ = message.register_();
        std::fprintf(stderr, "node %s: registered (%s, %d devices)\n", node_id_.c_str(),
                     message.register_().hostname().c_str(),
                     message.register_().devices_size() > 0
                         ? message.register_().devices(0).count()
                         : 0);
        CoordinatorMessage reply;
        reply.mutable_registered()->set_node_id(node_id_);
        reply.mutable_registered()->set_heartbeat_interval_ms(
            absl::ToInt64Milliseconds(heartbeat_interval_));
        reply.mutable_registered()->set_lease_ms(
            absl::ToInt64Milliseconds(service_->agent_lease()));
        if (const liveness::Grant* grant = channel_->liveness_grant(); grant != nullptr) {
          loom::v1::LivenessGrant* path = reply.mutable_registered()->mutable_liveness();
          path->set_port(static_cast<uint32_t>(service_->liveness_port()));
          path->set_session(grant->session);
          path->set_key(grant->key);
        }
        Enqueue(reply);
        service_->UpdateNodeGauges();
        jobs_->OnNodeRegistered(message.register_());
        return absl::OkStatus();
      }
      case NodeMessage::kHeartbeat:
        if (!node_id_.empty()) {
          // Copied only for a revival (not on every heartbeat).
          auto running = [&message] {
            return std::vector<loom::v1::RunningRank>(message.heartbeat().running().begin(),
                                                      message.heartbeat().running().end());
          };
          switch (nodes_->Heartbeat(node_id_, channel_.get(), message.heartbeat(), absl::Now())) {
            case NodeRegistry::HeartbeatResult::kAlive:
              break;
            case NodeRegistry::HeartbeatResult::kRevived:
              std::fprintf(stderr, "node %s: heartbeat on its session after it was lost; live again\n",
                           node_id_.c_str());
              service_->UpdateNodeGauges();
              jobs_->OnNodeRevived(node_id_, running());
              break;
            case NodeRegistry::HeartbeatResult::kOrphaned: {
              // Another session took this node over and ended; this one is
              // still here, so the node is its own again.
              std::fprintf(stderr, "node %s: its session is current again; live again\n",
                           node_id_.c_str());
              loom::v1::RegisterNode again = registration_;
              *again.mutable_running() = message.heartbeat().running();
              nodes_->Register(again, channel_, absl::Now());
              service_->UpdateNodeGauges();
              jobs_->OnNodeRegistered(again);
              jobs_->OnNodeRevived(node_id_, running());
              break;
            }
            case NodeRegistry::HeartbeatResult::kStale:
              return absl::OkStatus();  // another live session speaks for this node
          }
          // Read and recorded: the agent's lease runs from when it sent this
          // heartbeat (never acked on a stale session).
          EnqueueAck(message.heartbeat().seq());
          jobs_->OnNodeHeartbeat(node_id_, message.heartbeat());
        }
        return absl::OkStatus();
      case NodeMessage::kProgress:
        if (!node_id_.empty()) {
          if (absl::Status s = CheckProgressBatch(message.progress(), service_->node_limits());
              !s.ok()) {
            std::fprintf(stderr, "node %s: session ended: %s\n", node_id_.c_str(),
                         std::string(s.message()).c_str());
            return s;
          }
          const ProgressBatchResult result = jobs_->OnRankProgressBatch(node_id_, message.progress());
          if (result.refused > 0) RefusedProgress(result);
          // `loomctl trace`: the relay checks that it asked this node for the rank.
          if (TraceRelay* traces = service_->trace_relay(); traces != nullptr) {
            for (const loom::v1::RankProgress& report : message.progress().reports()) {
              if (report.has_trace()) traces->Deliver(node_id_, report);
            }
          }
        }
        return absl::OkStatus();
      case NodeMessage::kRankExited:
        if (!node_id_.empty()) jobs_->OnRankExited(node_id_, message.rank_exited());
        return absl::OkStatus();
      case NodeMessage::kDraining:
        // The agent is shutting down: its jobs stop gracefully and go on
        // elsewhere (a lock on the job table, no wait).
        if (!node_id_.empty()) {
          const std::string reason = SafeText(message.draining().reason().substr(0, 256));
          if (absl::StatusOr<loom::v1::Node> drained =
                  jobs_->Drain(node_id_, absl::StrCat("its agent is shutting down: ", reason));
              !drained.ok()) {
            std::fprintf(stderr, "node %s: could not drain: %s\n", node_id_.c_str(),
                         std::string(drained.status().message()).c_str());
          }
        }
        return absl::OkStatus();
      case NodeMessage::kLogChunk:
        // Queued for the relay's thread; it checks that this node was asked.
        if (!node_id_.empty() && service_->log_relay() != nullptr) {
          service_->log_relay()->Deliver(node_id_, message.log_chunk());
        }
        return absl::OkStatus();
      default:
        return absl::OkStatus();
    }
  }

  // Counts reports refused for ranks this node does not run; a log line at
  // most every 10 s per session (a misbehaving agent sends them at its rate).
  void RefusedProgress(const ProgressBatchResult& result) {
    service_->CountProgressRefused(result.refused);
    refused_since_log_ += result.refused;
    const absl::Time now = absl::Now();
    if (now - last_refused_log_ < absl::Seconds(10)) return;
    std::fprintf(stderr,
                 "node %s: ignored %lld progress reports for ranks it does not run in their "
                 "jobs' current attempts or beyond their jobs' bounds (the last batch's first: %s)\n",
                 node_id_.c_str(), static_cast<long long>(refused_since_log_),
                 SafeText(result.first_refused).c_str());  // a node's bytes: escaped
    refused_since_log_ = 0;
    last_refused_log_ = now;
  }

  void WriteNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (outgoing_.empty() || finished_) return;
    current_ = std::move(outgoing_.front());
    outgoing_.pop_front();
    if (current_.has_heartbeat_ack()) {
      current_.mutable_heartbeat_ack()->set_seq(ack_seq_);
      ack_queued_ = false;
    }
    writing_ = true;
    StartWrite(&current_);
  }

  void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    Finish(status);
  }

  NodeServiceImpl* service_;
  NodeRegistry* nodes_;
  JobManager* jobs_;
  const absl::Duration heartbeat_interval_;
  std::shared_ptr<SessionChannel> channel_;
  const absl::StatusOr<auth::Identity> caller_;
  std::string node_id_;  // set by the first message; read-side only
  loom::v1::RegisterNode registration_;  // read-side only
  NodeMessage incoming_;
  int64_t refused_since_log_ = 0;                         // read-side only
  absl::Time last_refused_log_ = absl::InfinitePast();    // read-side only

  absl::Mutex mu_;
  std::deque<CoordinatorMessage> outgoing_ ABSL_GUARDED_BY(mu_);
  CoordinatorMessage current_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool ack_queued_ ABSL_GUARDED_BY(mu_) = false;  // an ack waits in outgoing_
  int64_t ack_seq_ ABSL_GUARDED_BY(mu_) = 0;       // the newest heartbeat read
};

void SessionChannel::Send(const CoordinatorMessage& message) {
  absl::MutexLock lock(&mu_);
  if (reactor_ != nullptr) reactor_->Enqueue(message);
}

}  // namespace

grpc::ServerBidiReactor<NodeMessage, CoordinatorMessage>* NodeServiceImpl::Session(
    grpc::CallbackServerContext* context) {
  return new SessionReactor(this, nodes_, jobs_, heartbeat_interval_,
                            auth_->Admit(*context, "/loom.v1.NodeService/Session"));
}

void NodeServiceImpl::CountProgressRefused(int64_t reports) {
  if (metrics_ != nullptr) metrics_->CountProgressRefused(reports);
}

void NodeServiceImpl::UpdateNodeGauges() {
  if (metrics_ == nullptr) return;
  const NodeCounts counts = nodes_->Counts();
  std::map<std::string, int> devices;
  for (const auto& [kind, count] : counts.live_devices) devices[kind] = static_cast<int>(count);
  metrics_->SetNodes(counts.live, counts.cordoned, devices);
}

}  // namespace loom::coordinator
