// A coordinator the loadgen tests play over loopback gRPC (plaintext): one
// NodeService session per node, answered with Registered (and a lease) and a
// HeartbeatAck per heartbeat unless told not to, recording every heartbeat,
// exit and progress report in arrival order; and the RankService store over
// the coordinator's own KvStore, each op refused unless its rank token opens
// its namespace (as the real rank service checks). The test sends the rest
// (launches, aborts, epochs, kills, resumes) itself, built by the
// coordinator's own pure pieces (test_job.h).
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/rendezvous/kv_store.h"
#include "grpcpp/grpcpp.h"
#include "loom/v1/node.grpc.pb.h"
#include "loom/v1/rank.grpc.pb.h"

namespace loom::loadgen::testing {

class FakeCoordinator {
 public:
  struct Report {
    std::string node;
    loom::v1::RankProgress progress;
  };
  struct Beat {
    std::string node;
    loom::v1::Heartbeat heartbeat;
  };

  explicit FakeCoordinator(int64_t lease_ms);
  ~FakeCoordinator();  // drops the namespaces (their waiting gets end) and stops the server

  std::string address() const { return address_; }

  // A namespace and the tokens that open it (rank r: tokens[r]); carried:
  // opened as the coordinator opens an in-place attempt's (KvStore).
  void OpenNamespace(const std::string& ns, const std::vector<std::string>& tokens,
                     const coordinator::CarriedEntries* carried = nullptr);
  // The sets and adds that reached namespace ns, and the value of key there.
  int64_t WritesIn(const std::string& ns) const;
  absl::StatusOr<std::string> ValueIn(const std::string& ns, const std::string& key);
  // Sends a message on the node's session; false when it has none.
  bool Send(const std::string& node, const loom::v1::CoordinatorMessage& message);
  // Heartbeats of this node are read but no longer acknowledged (or again).
  void SetAcks(const std::string& node, bool ack);

  // Waits (up to timeout) until pred holds over what arrived; pred runs
  // under the lock.
  bool WaitFor(const std::function<bool()>& pred, absl::Duration timeout = absl::Seconds(30));
  // Under WaitFor's pred, or copies:
  const std::vector<Report>& reports() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return reports_; }
  const std::vector<Beat>& heartbeats() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return heartbeats_;
  }
  const std::vector<loom::v1::RankExited>& exits() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return exits_;
  }
  const std::set<std::string>& ended() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return ended_; }
  std::vector<Report> Reports() const;
  std::vector<Beat> Heartbeats() const;
  std::vector<loom::v1::RankExited> Exits() const;
  size_t ReportCount() const;

  mutable absl::Mutex mu_;

 private:
  class Nodes;
  class Ranks;
  using Stream = grpc::ServerReaderWriter<loom::v1::CoordinatorMessage, loom::v1::NodeMessage>;

  grpc::Status Session(Stream* stream);
  // The namespace an op's token opens, or PERMISSION_DENIED.
  absl::Status Check(const std::string& token, const std::string& ns) const;

  const int64_t lease_ms_;
  coordinator::KvStore kv_;
  std::unique_ptr<Nodes> nodes_;
  std::unique_ptr<Ranks> ranks_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;

  std::map<std::string, Stream*> streams_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> no_acks_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> tokens_ ABSL_GUARDED_BY(mu_);  // token -> namespace
  std::vector<std::string> namespaces_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> writes_ ABSL_GUARDED_BY(mu_);  // by namespace
  std::vector<Report> reports_ ABSL_GUARDED_BY(mu_);
  std::vector<Beat> heartbeats_ ABSL_GUARDED_BY(mu_);
  std::vector<loom::v1::RankExited> exits_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> ended_ ABSL_GUARDED_BY(mu_);
};

}  // namespace loom::loadgen::testing
