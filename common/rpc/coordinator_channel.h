// Channels to a coordinator given as one address or several
// ("HOST:PORT,HOST:PORT": the coordinators of a highly available cluster,
// one leading, the others standing by). Clients (agents, ranks, loomctl) keep
// one of these and follow the leader: a standby answers every Loom call with
// UNAVAILABLE, names the leader in trailing metadata "loom-leader", and
// reports NOT_SERVING on grpc.health.v1; FindLeader asks each address's
// health service. With a single address every method is a plain channel to
// it, exactly as before. Thread-safe.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"

namespace loom::rpc {

inline constexpr char kLeaderMetadataKey[] = "loom-leader";

// "a:1,b:2" -> {"a:1", "b:2"}; empty entries are dropped.
std::vector<std::string> SplitAddresses(const std::string& addresses);

class CoordinatorChannel {
 public:
  CoordinatorChannel(const std::string& addresses,
                     std::shared_ptr<grpc::ChannelCredentials> credentials);

  bool several() const { return addresses_.size() > 1; }
  // The channel (and its address) calls go to now.
  std::shared_ptr<grpc::Channel> channel();
  std::string address();

  // After a call on channel() failed with status: when it was UNAVAILABLE,
  // calls go next to the leader the answer named (a standby's trailing
  // metadata), else to the next address. Other errors change nothing.
  void Failed(const grpc::Status& status, const grpc::ClientContext* context);

  // Asks every address's health service (each within per_address) until one
  // is SERVING, starting with the current one; calls go there from now on.
  // False if none was.
  bool FindLeader(absl::Duration per_address = absl::Seconds(1));

 private:
  std::shared_ptr<grpc::Channel> ChannelLocked(const std::string& address)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::vector<std::string> addresses_;
  const std::shared_ptr<grpc::ChannelCredentials> credentials_;
  absl::Mutex mu_;
  std::string current_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels_ ABSL_GUARDED_BY(mu_);
};

}  // namespace loom::rpc
