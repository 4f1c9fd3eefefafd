// A node agent assembled in the test process as loom-worker assembles it
// (main.cc): rank manager with its lease and control streams, the lease
// watcher that pauses ranks, the session, the store relay and AgentService on
// a Unix socket; and a client that calls that socket as one of its ranks
// does (progress, store, control, with the rank's token). Ranks are real
// processes (the test's stand-in trainer); the coordinator is the test's fake.
#pragma once

#include <atomic>
#include <filesystem>
#include <memory>
#include <optional>
#include <vector>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/security/credentials.h"
#include "loom/v1/node.grpc.pb.h"
#include "worker/agent/agent_service.h"
#include "worker/agent/lease.h"
#include "worker/agent/node_session.h"
#include "worker/agent/rank_control.h"
#include "worker/agent/rank_manager.h"
#include "worker/agent/store_relay.h"

namespace loom::agent::testing {

class AgentHarness {
 public:
  // rank_options.work_dir holds the socket; the session goes to
  // `coordinator` (plaintext, loopback), and so do the relayed store calls.
  AgentHarness(RankManagerOptions rank_options, const std::string& coordinator)
      : channel_(std::make_shared<rpc::CoordinatorChannel>(coordinator,
                                                           grpc::InsecureChannelCredentials())),
        ranks_(WithFences(std::move(rank_options)),
               [this](loom::v1::RankExited exited) {
                 if (NodeSession* s = current_.load()) s->ReportExit(std::move(exited));
               }),
        watcher_(&lease_, [this] { ranks_.PauseAll(); }),
        relay_(channel_, Relay(), &lease_),
        session_(SessionOptions(coordinator), &ranks_),
        service_(
            &ranks_,
            [this](loom::v1::RankProgress p) { session_.ReportProgress(std::move(p)); },
            &relay_, &control_) {
    current_.store(&session_);
    target_ = *AgentSocketTarget(work_dir_);
    server_ = *StartAgentServer(target_, /*world_writable=*/false, &service_);
    session_thread_ = std::thread([this] { session_.Run(); });
  }
  ~AgentHarness() {
    ranks_.Shutdown(absl::Seconds(30));  // exits are reported while the session lives
    relay_.Shutdown();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    session_.Shutdown(absl::Seconds(2));
    session_thread_.join();
    current_.store(nullptr);
  }

  RankManager& ranks() { return ranks_; }
  Lease& lease() { return lease_; }
  RankControlHub& control() { return control_; }
  NodeSession& session() { return session_; }
  const std::string& target() const { return target_; }

 private:
  RankManagerOptions WithFences(RankManagerOptions options) {
    work_dir_ = options.work_dir;
    std::filesystem::create_directories(work_dir_);
    options.lease = &lease_;
    options.control = &control_;
    return options;
  }
  static StoreRelayOptions Relay() {
    StoreRelayOptions options;
    options.initial_backoff = absl::Milliseconds(20);
    return options;
  }
  NodeSessionOptions SessionOptions(const std::string& coordinator) {
    NodeSessionOptions options;
    options.coordinator = coordinator;
    options.coordinators = channel_;
    options.registration.set_node_id("node-a");
    options.registration.set_hostname("host-a");
    options.registration.set_address("127.0.0.1");
    loom::v1::Device* device = options.registration.add_devices();
    device->set_kind("cpu");
    device->set_count(4);
    options.initial_backoff = absl::Milliseconds(50);
    options.max_backoff = absl::Milliseconds(400);
    options.progress_batch_window = absl::Milliseconds(10);
    options.lease = &lease_;
    return options;
  }

  // Declaration order is construction order (main.cc's): what is used is
  // built first and destroyed last.
  std::string work_dir_;
  Lease lease_;
  RankControlHub control_;
  std::shared_ptr<rpc::CoordinatorChannel> channel_;
  std::atomic<NodeSession*> current_{nullptr};
  RankManager ranks_;
  LeaseWatcher watcher_;
  StoreRelay relay_;
  NodeSession session_;
  AgentServiceImpl service_;
  std::string target_;
  std::unique_ptr<grpc::Server> server_;
  std::thread session_thread_;
};

// Calls an agent's socket as one of its ranks does, with a token.
class RankClient {
 public:
  explicit RankClient(const std::string& target)
      : stub_(loom::v1::AgentService::NewStub(
            grpc::CreateChannel(target, grpc::experimental::LocalCredentials(UDS)))) {}

  grpc::Status Set(const std::string& token, const std::string& store_namespace,
                   const std::string& key, absl::Duration timeout = absl::Seconds(20)) {
    loom::v1::StoreSetRequest request;
    request.set_store_namespace(store_namespace);
    request.set_key(key);
    request.set_value("v");
    loom::v1::StoreSetResponse response;
    grpc::ClientContext context;
    Prepare(context, token, timeout);
    return stub_->StoreSet(&context, request, &response);
  }
  grpc::Status Add(const std::string& token, const std::string& store_namespace,
                   const std::string& key) {
    loom::v1::StoreAddRequest request;
    request.set_store_namespace(store_namespace);
    request.set_key(key);
    request.set_delta(1);
    loom::v1::StoreAddResponse response;
    grpc::ClientContext context;
    Prepare(context, token, absl::Seconds(20));
    return stub_->StoreAdd(&context, request, &response);
  }
  // One stream carrying `reports`; its status.
  grpc::Status Report(const std::string& token,
                      const std::vector<loom::v1::RankProgress>& reports) {
    grpc::ClientContext context;
    Prepare(context, token, absl::Seconds(20));
    loom::v1::ReportProgressResponse response;
    auto writer = stub_->ReportProgress(&context, &response);
    for (const auto& report : reports) {
      if (!writer->Write(report)) break;
    }
    writer->WritesDone();
    return writer->Finish();
  }
  loom::v1::AgentService::Stub* stub() { return stub_.get(); }

  static void Prepare(grpc::ClientContext& context, const std::string& token,
                      absl::Duration timeout) {
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
  }

 private:
  std::unique_ptr<loom::v1::AgentService::Stub> stub_;
};

// A rank's control stream, read on the test's thread (bounded by a deadline).
class ControlReader {
 public:
  ControlReader(loom::v1::AgentService::Stub* stub, const std::string& token) {
    RankClient::Prepare(context_, token, absl::Seconds(60));
    reader_ = stub->Control(&context_, loom::v1::ControlRequest());
  }
  std::optional<loom::v1::RankControl> Next() {
    loom::v1::RankControl message;
    if (!reader_->Read(&message)) return std::nullopt;
    return message;
  }
  grpc::Status Finish() {
    loom::v1::RankControl ignored;
    while (reader_->Read(&ignored)) {
    }
    return reader_->Finish();
  }

 private:
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReader<loom::v1::RankControl>> reader_;
};

}  // namespace loom::agent::testing
