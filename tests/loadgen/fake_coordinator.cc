#include "tests/loadgen/fake_coordinator.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/rpc/rpc_settings.h"

namespace loom::loadgen::testing {

class FakeCoordinator::Nodes final : public loom::v1::NodeService::Service {
 public:
  explicit Nodes(FakeCoordinator* c) : c_(c) {}
  grpc::Status Session(grpc::ServerContext*, Stream* stream) override {
    return c_->Session(stream);
  }

 private:
  FakeCoordinator* const c_;
};

class FakeCoordinator::Ranks final : public loom::v1::RankService::Service {
 public:
  explicit Ranks(FakeCoordinator* c) : c_(c) {}

  grpc::Status StoreBatch(grpc::ServerContext*, const loom::v1::StoreBatchRequest* request,
                          loom::v1::StoreBatchResponse* response) override {
    for (const loom::v1::StoreOp& op : request->ops()) {
      loom::v1::StoreOpResult* result = response->add_results();
      const std::string& ns =
          op.has_set() ? op.set().store_namespace() : op.add().store_namespace();
      absl::Status s = c_->Check(op.rank_token(), ns);
      if (s.ok()) {
        absl::MutexLock lock(&c_->mu_);
        ++c_->writes_[ns];
      }
      if (s.ok() && op.has_set()) {
        s = c_->kv_.Set(ns, op.set().key(), op.set().value());
      } else if (s.ok()) {
        absl::StatusOr<int64_t> value = c_->kv_.Add(ns, op.add().key(), op.add().delta());
        s = value.status();
        if (value.ok()) result->set_value(*value);
      }
      result->set_code(static_cast<int32_t>(s.code()));
      result->set_message(std::string(s.message()));
    }
    return grpc::Status::OK;
  }

  grpc::Status StoreGet(grpc::ServerContext* context, const loom::v1::StoreGetRequest* request,
                        loom::v1::StoreGetResponse* response) override {
    std::string token;
    auto it = context->client_metadata().find("authorization");
    if (it != context->client_metadata().end()) {
      const std::string value(it->second.data(), it->second.size());
      if (absl::StartsWith(value, "Bearer ")) token = value.substr(7);
    }
    if (absl::Status s = c_->Check(token, request->store_namespace()); !s.ok()) {
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, std::string(s.message()));
    }
    absl::StatusOr<std::string> value =
        c_->kv_.Get(request->store_namespace(), request->key(),
                    absl::Milliseconds(std::min<int64_t>(request->wait_ms(), 30'000)));
    if (!value.ok()) {
      return grpc::Status(static_cast<grpc::StatusCode>(value.status().code()),
                          std::string(value.status().message()));
    }
    response->set_value(*value);
    return grpc::Status::OK;
  }

 private:
  FakeCoordinator* const c_;
};

FakeCoordinator::FakeCoordinator(int64_t lease_ms)
    : lease_ms_(lease_ms),
      nodes_(std::make_unique<Nodes>(this)),
      ranks_(std::make_unique<Ranks>(this)) {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(nodes_.get());
  builder.RegisterService(ranks_.get());
  server_ = builder.BuildAndStart();
  address_ = absl::StrCat("127.0.0.1:", port);
}

FakeCoordinator::~FakeCoordinator() {
  std::vector<std::string> namespaces;
  {
    absl::MutexLock lock(&mu_);
    namespaces = namespaces_;
  }
  for (const std::string& ns : namespaces) kv_.DropNamespace(ns);
  server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
}

void FakeCoordinator::OpenNamespace(const std::string& ns, const std::vector<std::string>& tokens,
                                    const coordinator::CarriedEntries* carried) {
  kv_.OpenNamespace(ns, {}, carried);
  absl::MutexLock lock(&mu_);
  namespaces_.push_back(ns);
  for (const std::string& token : tokens) tokens_[token] = ns;
}

int64_t FakeCoordinator::WritesIn(const std::string& ns) const {
  absl::MutexLock lock(&mu_);
  auto it = writes_.find(ns);
  return it == writes_.end() ? 0 : it->second;
}

absl::StatusOr<std::string> FakeCoordinator::ValueIn(const std::string& ns, const std::string& key) {
  return kv_.Get(ns, key, absl::ZeroDuration());
}

absl::Status FakeCoordinator::Check(const std::string& token, const std::string& ns) const {
  absl::MutexLock lock(&mu_);
  auto it = tokens_.find(token);
  if (it == tokens_.end() || it->second != ns) {
    return absl::PermissionDeniedError(absl::StrCat("the rank token does not open ", ns));
  }
  return absl::OkStatus();
}

bool FakeCoordinator::Send(const std::string& node, const loom::v1::CoordinatorMessage& message) {
  absl::MutexLock lock(&mu_);
  auto it = streams_.find(node);
  return it != streams_.end() && it->second->Write(message);
}

void FakeCoordinator::SetAcks(const std::string& node, bool ack) {
  absl::MutexLock lock(&mu_);
  if (ack) {
    no_acks_.erase(node);
  } else {
    no_acks_.insert(node);
  }
}

grpc::Status FakeCoordinator::Session(Stream* stream) {
  loom::v1::NodeMessage in;
  if (!stream->Read(&in) || !in.has_register_()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "RegisterNode first");
  }
  const std::string node = in.register_().node_id();
  {
    absl::MutexLock lock(&mu_);
    streams_[node] = stream;
    loom::v1::CoordinatorMessage registered;
    registered.mutable_registered()->set_node_id(node);
    registered.mutable_registered()->set_heartbeat_interval_ms(1000);
    registered.mutable_registered()->set_lease_ms(lease_ms_);
    stream->Write(registered);
  }
  while (stream->Read(&in)) {
    absl::MutexLock lock(&mu_);
    if (in.has_heartbeat()) {
      heartbeats_.push_back({node, in.heartbeat()});
      if (no_acks_.count(node) == 0) {
        loom::v1::CoordinatorMessage ack;
        ack.mutable_heartbeat_ack()->set_seq(in.heartbeat().seq());
        stream->Write(ack);
      }
    } else if (in.has_progress()) {
      for (const loom::v1::RankProgress& p : in.progress().reports()) reports_.push_back({node, p});
    } else if (in.has_rank_exited()) {
      exits_.push_back(in.rank_exited());
    }
  }
  absl::MutexLock lock(&mu_);
  streams_.erase(node);
  ended_.insert(node);
  return grpc::Status::OK;
}

bool FakeCoordinator::WaitFor(const std::function<bool()>& pred, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&pred), timeout);
}

std::vector<FakeCoordinator::Report> FakeCoordinator::Reports() const {
  absl::MutexLock lock(&mu_);
  return reports_;
}

std::vector<FakeCoordinator::Beat> FakeCoordinator::Heartbeats() const {
  absl::MutexLock lock(&mu_);
  return heartbeats_;
}

std::vector<loom::v1::RankExited> FakeCoordinator::Exits() const {
  absl::MutexLock lock(&mu_);
  return exits_;
}

size_t FakeCoordinator::ReportCount() const {
  absl::MutexLock lock(&mu_);
  return reports_.size();
}

}  // namespace loom::loadgen::testing
