// Adapts a loom::comm::Store to the gloo::rendezvous::Store that Gloo's
// connectFullMesh uses to exchange the ranks' TCP addresses. Internal to the
// Gloo communicator.
#pragma once

#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gloo/rendezvous/store.h"
#include "worker/comm/store.h"

namespace loom::comm {

class GlooStoreBridge : public gloo::rendezvous::Store {
 public:
  // Keys are placed under prefix + "/". Waits last at most `timeout` each.
  GlooStoreBridge(loom::comm::Store& store, std::string prefix, absl::Duration timeout);

  // These throw gloo::IoException on failure: they run inside Gloo, and the
  // communicator converts what comes out of Gloo at its boundary.
  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

  // The last key whose wait timed out ("" if none), to name the missing rank.
  std::string missing_key() const;

 private:
  std::string FullKey(const std::string& key) const;

  loom::comm::Store& store_;
  const std::string prefix_;
  const absl::Duration timeout_;
  mutable std::mutex mu_;
  std::string missing_key_;
};

}  // namespace loom::comm
