// A tiny in-process NodeService for the agent tests: records what agents
// send, answers RegisterNode with Registered (with a lease when given one),
// acknowledges every heartbeat it reads (HeartbeatAck) until told to stop,
// and lets a test push commands (LaunchRank, KillRanks, AbortRanks,
// EnterEpoch, ResumeRanks) down the current session. It can be stopped and
// started again on the same port, like a coordinator restart.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/rpc/rpc_settings.h"
#include "grpcpp/grpcpp.h"
#include "loom/v1/node.grpc.pb.h"

namespace loom::agent::testing {

class FakeNodeService final : public loom::v1::NodeService::Service {
 public:
  explicit FakeNodeService(int64_t heartbeat_ms = 50, int64_t lease_ms = 0)
      : heartbeat_ms_(heartbeat_ms), lease_ms_(lease_ms) {}

  // Stops (or resumes) acknowledging heartbeats: a coordinator that no
  // longer reads them, as the agent's lease sees it.
  void set_acking(bool acking) { acking_.store(acking); }

  // Listens on 127.0.0.1:port (0: any free port); returns the port. `also`
  // is served on the same port (a fake RankService: the agent relays its
  // ranks' store calls on the session's channel).
  int Start(int port = 0, grpc::Service* also = nullptr) {
    grpc::ServerBuilder builder;
    rpc::ApplyServerSettings(builder);
    builder.AddListeningPort(absl::StrCat("127.0.0.1:", port), grpc::InsecureServerCredentials(),
                             &port_);
    builder.RegisterService(this);
    if (also != nullptr) builder.RegisterService(also);
    server_ = builder.BuildAndStart();
    return port_;
  }

  // Ends every session at once (a coordinator crash, as the agent sees it).
  void Stop() {
    if (server_ == nullptr) return;
    server_->Shutdown(std::chrono::system_clock::now());
    server_->Wait();
    server_.reset();
  }

  ~FakeNodeService() override { Stop(); }

  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

  // Queues a command for the session that is current (or the next one).
  void Send(loom::v1::CoordinatorMessage message) {
    std::lock_guard lock(mu_);
    commands_.push_back(std::move(message));
    cv_.notify_all();
  }

  // Waits until `predicate` holds over everything received so far (all
  // sessions, in order); false after the timeout.
  bool WaitFor(const std::function<bool(const std::vector<loom::v1::NodeMessage>&)>& predicate,
               absl::Duration timeout = absl::Seconds(30)) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                        [&] { return predicate(received_); });
  }

  std::vector<loom::v1::NodeMessage> received() {
    std::lock_guard lock(mu_);
    return received_;
  }
  // A copy of the newest heartbeat received (empty when none came yet).
  loom::v1::Heartbeat last_heartbeat() {
    std::lock_guard lock(mu_);
    for (auto it = received_.rbegin(); it != received_.rend(); ++it) {
      if (it->has_heartbeat()) return it->heartbeat();
    }
    return {};
  }
  int sessions() {
    std::lock_guard lock(mu_);
    return sessions_;
  }
  // Sessions that ended with the agent half-closing its side.
  int clean_goodbyes() {
    std::lock_guard lock(mu_);
    return clean_goodbyes_;
  }

  grpc::Status Session(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<loom::v1::CoordinatorMessage, loom::v1::NodeMessage>* stream)
      override {
    {
      std::lock_guard lock(mu_);
      ++sessions_;
    }
    bool done = false;
    std::thread writer([&] {
      std::unique_lock lock(mu_);
      while (true) {
        cv_.wait(lock, [&] { return done || !commands_.empty(); });
        if (done) return;
        loom::v1::CoordinatorMessage command = commands_.front();
        commands_.pop_front();
        lock.unlock();
        bool ok = stream->Write(command);
        lock.lock();
        if (!ok) {
          commands_.push_front(command);
          return;
        }
      }
    });
    loom::v1::NodeMessage message;
    bool first = true;
    while (stream->Read(&message)) {
      if (first && message.has_register_()) {
        loom::v1::CoordinatorMessage registered;
        registered.mutable_registered()->set_node_id(message.register_().node_id());
        registered.mutable_registered()->set_heartbeat_interval_ms(heartbeat_ms_);
        registered.mutable_registered()->set_lease_ms(lease_ms_);
        // Ahead of any queued command: the agent must see Registered first.
        std::lock_guard lock(mu_);
        commands_.push_front(registered);
      }
      if (message.has_heartbeat() && acking_.load()) {
        loom::v1::CoordinatorMessage ack;
        ack.mutable_heartbeat_ack()->set_seq(message.heartbeat().seq());
        std::lock_guard lock(mu_);
        commands_.push_back(ack);
      }
      first = false;
      std::lock_guard lock(mu_);
      received_.push_back(message);
      cv_.notify_all();
    }
    {
      std::lock_guard lock(mu_);
      if (!context->IsCancelled()) ++clean_goodbyes_;
      done = true;
      cv_.notify_all();
    }
    writer.join();
    return grpc::Status::OK;
  }

 private:
  const int64_t heartbeat_ms_;
  const int64_t lease_ms_;
  std::atomic<bool> acking_{true};
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<loom::v1::CoordinatorMessage> commands_;
  std::vector<loom::v1::NodeMessage> received_;
  int sessions_ = 0;
  int clean_goodbyes_ = 0;
};

// Helpers over a list of received messages.
inline int CountKind(const std::vector<loom::v1::NodeMessage>& messages,
                     loom::v1::NodeMessage::KindCase kind) {
  int count = 0;
  for (const auto& m : messages) count += m.kind_case() == kind ? 1 : 0;
  return count;
}

inline const loom::v1::RankExited* FindExit(const std::vector<loom::v1::NodeMessage>& messages,
                                            const std::string& job_id, int attempt, int rank) {
  for (const auto& m : messages) {
    if (m.has_rank_exited() && m.rank_exited().job_id() == job_id &&
        m.rank_exited().attempt() == attempt && m.rank_exited().rank() == rank) {
      return &m.rank_exited();
    }
  }
  return nullptr;
}

inline loom::v1::CoordinatorMessage LaunchMessage(const std::string& job_id, int attempt,
                                                  int rank) {
  loom::v1::CoordinatorMessage message;
  loom::v1::RankAssignment* a = message.mutable_launch()->mutable_assignment();
  a->set_job_id(job_id);
  a->set_attempt(attempt);
  a->set_rank(rank);
  a->set_world_size(2);
  a->set_spec_yaml("name: test\n");
  // What a rank's calls to its agent carry (see EnterEpochMessage).
  a->set_rank_token(absl::StrCat(job_id, "-a", attempt, "-r", rank));
  a->set_store_namespace(absl::StrCat(job_id, "/attempt-", attempt));
  return message;
}

inline loom::v1::CoordinatorMessage KillMessage(const std::string& job_id, int attempt,
                                                double grace_seconds) {
  loom::v1::CoordinatorMessage message;
  message.mutable_kill()->set_job_id(job_id);
  message.mutable_kill()->set_attempt(attempt);
  message.mutable_kill()->set_grace_seconds(grace_seconds);
  return message;
}

// The newest heartbeat in `messages`, or nullptr (for predicates over the
// messages WaitFor holds; FakeNodeService::last_heartbeat copies one).
inline const loom::v1::Heartbeat* LastHeartbeat(
    const std::vector<loom::v1::NodeMessage>& messages) {
  for (auto it = messages.rbegin(); it != messages.rend(); ++it) {
    if (it->has_heartbeat()) return &it->heartbeat();
  }
  return nullptr;
}

inline loom::v1::CoordinatorMessage AbortMessage(const std::string& job_id, int attempt) {
  loom::v1::CoordinatorMessage message;
  message.mutable_abort()->set_job_id(job_id);
  message.mutable_abort()->set_attempt(attempt);
  message.mutable_abort()->set_reason("rank 3 crashed");
  return message;
}

// EnterEpoch from attempt `from` to `to` for `ranks`, each with the token
// "<job>-a<to>-r<rank>" and the namespace "<job>/attempt-<to>".
inline loom::v1::CoordinatorMessage EnterEpochMessage(const std::string& job_id, int from, int to,
                                                      const std::vector<int>& ranks) {
  loom::v1::CoordinatorMessage message;
  loom::v1::EnterEpoch* epoch = message.mutable_enter_epoch();
  epoch->set_job_id(job_id);
  epoch->set_from_attempt(from);
  epoch->set_attempt(to);
  epoch->set_store_namespace(absl::StrCat(job_id, "/attempt-", to));
  epoch->set_restore_step(7);
  for (int rank : ranks) {
    loom::v1::RankEpoch* entry = epoch->add_ranks();
    entry->set_rank(rank);
    entry->set_rank_token(absl::StrCat(job_id, "-a", to, "-r", rank));
    entry->mutable_snapshots()->set_buddy_rank(rank + 1);
    entry->mutable_snapshots()->set_ward_rank(rank - 1);
  }
  return message;
}

inline loom::v1::CoordinatorMessage ResumeMessage(const std::vector<loom::v1::RunningRank>& ranks) {
  loom::v1::CoordinatorMessage message;
  for (const auto& rank : ranks) *message.mutable_resume()->add_ranks() = rank;
  return message;
}

}  // namespace loom::agent::testing
