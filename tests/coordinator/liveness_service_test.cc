// NodeLivenessImpl (coordinator/service/liveness_service.h) over loopback
// gRPC, with the real NodeRegistry: a beat is answered while every callback
// thread of the server is blocked (what starved heartbeats on the session
// path), and it speaks for a node only on its session's connection.
#include "coordinator/service/liveness_service.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace loom::coordinator {
namespace {

using std::chrono::milliseconds;

// Any other call of the server, at its worst: each holds the callback thread
// that serves it until released. Records the connection its calls came on.
class BlockingService final : public grpc::CallbackGenericService {
 public:
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* context) override {
    std::unique_lock lock(mu_);
    if (peer_.empty()) peer_ = context->peer();
    ++entered_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return released_; });
    class Done final : public grpc::ServerGenericBidiReactor {
     public:
      Done() { Finish(grpc::Status::OK); }
      void OnDone() override { delete this; }
    };
    return new Done;
  }
  void Release() {
    std::lock_guard lock(mu_);
    released_ = true;
    cv_.notify_all();
  }
  // Waits until the number of blocked calls stops growing (for `settle`).
  int SettledEntries(milliseconds settle) {
    std::unique_lock lock(mu_);
    int seen = -1;
    while (seen != entered_) {
      seen = entered_;
      cv_.wait_for(lock, settle, [&] { return entered_ != seen; });
    }
    return entered_;
  }
  std::string peer() {
    std::lock_guard lock(mu_);
    return peer_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int entered_ = 0;
  bool released_ = false;
  std::string peer_;
};

class PeerChannel final : public NodeChannel {
 public:
  explicit PeerChannel(std::string peer) : peer_(std::move(peer)) {}
  void Send(const loom::v1::CoordinatorMessage&) override {}
  std::string peer() const override { return peer_; }

 private:
  std::string peer_;
};

loom::v1::RegisterNode Node(const std::string& id) {
  loom::v1::RegisterNode node;
  node.set_node_id(id);
  loom::v1::Device* device = node.add_devices();
  device->set_kind("cpu");
  device->set_count(2);
  return node;
}

class LivenessServiceTest : public ::testing::Test {
 protected:
  LivenessServiceTest() : auth_(CallerAuth::Insecure()), liveness_(&nodes_, &auth_) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&liveness_);
    builder.RegisterCallbackGenericService(&blocking_);
    server_ = builder.BuildAndStart();
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(port_),
                                   grpc::InsecureChannelCredentials());
  }
  ~LivenessServiceTest() override {
    blocking_.Release();
    for (auto& call : calls_) call->Wait();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }

  // Starts a call that blocks a callback thread of the server.
  void Block() {
    calls_.push_back(std::make_unique<BlockedCall>());
    BlockedCall* call = calls_.back().get();
    grpc::GenericStub(channel_).UnaryCall(&call->context, "/test.Blocking/Hold",
                                          grpc::StubOptions(), &call->request, &call->response,
                                          [call](grpc::Status) { call->Finished(); });
  }

  grpc::Status Beat(const std::string& node, int64_t seq, loom::v1::NodeBeatAck* ack) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    loom::v1::NodeBeat beat;
    beat.set_node_id(node);
    beat.set_seq(seq);
    return loom::v1::NodeLiveness::NewStub(channel_)->Beat(&context, beat, ack);
  }

  struct BlockedCall {
    grpc::ClientContext context;
    grpc::Slice byte{"x", 1};
    grpc::ByteBuffer request{&byte, 1};
    grpc::ByteBuffer response;
    std::mutex mu;
    std::condition_variable cv;
    bool finished = false;
    void Finished() {
      std::lock_guard lock(mu);
      finished = true;
      cv.notify_all();
    }
    void Wait() {
      std::unique_lock lock(mu);
      cv.wait_for(lock, std::chrono::seconds(10), [&] { return finished; });
    }
  };

  NodeRegistry nodes_;
  CallerAuth auth_;
  NodeLivenessImpl liveness_;
  BlockingService blocking_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::vector<std::unique_ptr<BlockedCall>> calls_;
};

TEST_F(LivenessServiceTest, ABeatIsAnsweredWhileEveryCallbackThreadIsBlocked) {
  constexpr int kCalls = 64;
  for (int i = 0; i < kCalls; ++i) Block();
  const int blocked = blocking_.SettledEntries(milliseconds(500));
  // The premise: the server's callback threads are all held, so calls wait
  // unserved (on this machine 2 of 64 got a thread; a callback-served beat
  // then missed a 2 s deadline).
  ASSERT_GT(blocked, 0);
  ASSERT_LT(blocked, kCalls) << "the callback threads were not exhausted; the test shows nothing";

  // Registered long ago: only the beat can keep it from being silent.
  nodes_.Register(Node("n1"), std::make_shared<PeerChannel>(blocking_.peer()),
                  absl::Now() - absl::Seconds(10));
  loom::v1::NodeBeatAck ack;
  const grpc::Status status = Beat("n1", 41, &ack);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(ack.seq(), 41);
  // Heard now: not silent for the timeout.
  EXPECT_TRUE(nodes_.ExpireSilent(absl::Now() + absl::Seconds(1), absl::Seconds(2)).empty());
}

TEST_F(LivenessServiceTest, ABeatSpeaksOnlyForARegisteredNodeOnItsSessionsConnection) {
  loom::v1::NodeBeatAck ack;
  grpc::Status status = Beat("n1", 1, &ack);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(status.error_message().find("node n1 has not registered"), std::string::npos)
      << status.error_message();

  // The node's session runs on some other connection.
  nodes_.Register(Node("n1"), std::make_shared<PeerChannel>("ipv4:10.9.9.9:4000"), absl::Now());
  status = Beat("n1", 2, &ack);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(status.error_message().find("session runs on another connection"), std::string::npos)
      << status.error_message();
  // So the beat did not keep it.
  EXPECT_EQ(nodes_.ExpireSilent(absl::Now() + absl::Seconds(3), absl::Seconds(2)),
            std::vector<std::string>{"n1"});
}

}  // namespace
}  // namespace loom::coordinator
