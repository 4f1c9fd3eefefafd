#include "tools/loadgen/fake_cluster.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/rpc/rpc_settings.h"
#include "grpcpp/grpcpp.h"

namespace loom::loadgen {

FakeCluster::FakeCluster(ClusterOptions options, NodeCertFactory* certs)
    : options_(std::move(options)), certs_(certs), clock_(options_.step) {
  shared_.stats = &stats_;
  shared_.clock = &clock_;
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
    nodes_.push_back(std::make_unique<FakeNode>(
        id, options_.gpus_per_node, rpc::MakeChannel(options_.coordinator, credentials), &shared_));
  }
  return absl::OkStatus();
}

absl::Status FakeCluster::Connect(absl::Duration timeout) {
  for (auto& node : nodes_) node->Start();
  const absl::Time deadline = absl::Now() + timeout;
  while (stats_.sessions_registered.load() < options_.nodes) {
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(stats_.sessions_registered.load(), " of ",
                                                      options_.nodes, " nodes registered within ",
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
  const JobClock::View clock = clock_.At(now);
  for (size_t i = static_cast<size_t>(slice); i < nodes_.size(); i += static_cast<size_t>(slices)) {
    nodes_[i]->SendBatch(/*full=*/true, now, clock);
  }
  // The first step of an attempt completes on every rank together: each node
  // forwards its ranks' reports of it at once, as an agent's batch window does.
  const bool first_step_due = clock.stepping && clock.step > clock.base_step;
  for (auto& node : nodes_) {
    if (node->EventsPending(first_step_due)) node->SendBatch(/*full=*/false, now, clock);
  }
}

FakeNode* FakeCluster::NodeRunning(int rank) const {
  for (const auto& node : nodes_) {
    if (node->Runs(rank)) return node.get();
  }
  return nullptr;
}

absl::Status FakeCluster::StopRank(int rank) {
  FakeNode* node = NodeRunning(rank);
  if (node == nullptr || !node->SilenceRank(rank)) {
    return absl::NotFoundError(absl::StrCat("no node runs rank ", rank));
  }
  clock_.Freeze(absl::Now());
  return absl::OkStatus();
}

absl::Status FakeCluster::CrashRank(int rank) {
  FakeNode* node = NodeRunning(rank);
  if (node == nullptr || !node->CrashRank(rank)) {
    return absl::NotFoundError(absl::StrCat("no node runs rank ", rank));
  }
  clock_.Freeze(absl::Now());
  return absl::OkStatus();
}

absl::StatusOr<FakeCluster::LostNode> FakeCluster::LoseNodeOf(int rank) {
  FakeNode* node = NodeRunning(rank);
  if (node == nullptr) return absl::NotFoundError(absl::StrCat("no node runs rank ", rank));
  LostNode lost{node->id(), node->LiveRanks()};
  node->Lose();
  clock_.Freeze(absl::Now());
  return lost;
}

int FakeCluster::RanksBehind(const std::string& job_id) const {
  const int32_t attempt = clock_.At(absl::Now()).attempt;
  int behind = 0;
  for (const auto& node : nodes_) behind += node->RanksBehind(job_id, attempt);
  return behind;
}

void FakeCluster::Shutdown() {
  shared_.shutting_down = true;
  for (auto& node : nodes_) node->Cancel();
  absl::SleepFor(absl::Milliseconds(500));  // let the cancellations reach the coordinator
}

}  // namespace loom::loadgen
