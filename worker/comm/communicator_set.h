// The communicators of one job attempt, owned together so that a failure or
// an abort order reaches every one of them at once: the trainer's groups (tp,
// dp, pp, cp, dp_cp, ep) and its snapshot pair groups. Abort stops every
// member (a blocked collective returns ABORTED promptly, docs/comm.md) and
// every one added later, so an abort that arrives while the attempt is still
// building its groups is not lost. Shared ownership: the thread that delivers
// an abort (the trainer's control stream) holds the set while it aborts it,
// so no member is destroyed under it.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "worker/comm/communicator.h"

namespace loom::comm {

class CommunicatorSet {
 public:
  CommunicatorSet() = default;
  CommunicatorSet(const CommunicatorSet&) = delete;
  CommunicatorSet& operator=(const CommunicatorSet&) = delete;

  // Takes ownership; returns the communicator (null stays null and is not
  // kept). If the set was aborted already, the communicator is aborted now.
  Communicator* Add(std::unique_ptr<Communicator> communicator);

  // Aborts every member, now and added later, with `reason` (the first reason
  // is kept). Thread-safe, idempotent; the members' Abort runs outside the lock.
  void Abort(const std::string& reason);

  bool aborted() const;
  // The first abort's reason; empty when not aborted.
  std::string abort_reason() const;
  std::vector<Communicator*> members() const;

 private:
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Communicator>> members_;
  std::optional<std::string> aborted_;
};

}  // namespace loom::comm
