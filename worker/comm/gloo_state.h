// What a Gloo communicator shares with its background thread and with the
// Work handles it gives out (which may outlive it): the Gloo context, the
// first failure, the abort flag and the traffic counters. Internal to the
// Gloo communicator.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gloo/rendezvous/context.h"
#include "worker/comm/communicator.h"
#include "worker/comm/gloo_errors.h"

namespace loom::comm {

class AbortableGlooContext : public gloo::rendezvous::Context {
 public:
  using gloo::rendezvous::Context::Context;

  // Fails every pending and later transfer of this context with `message`:
  // waits blocked in Gloo wake up with a gloo::IoException, and the sockets
  // close, so the peers learn of it at once instead of at their timeout.
  // Thread-safe; a no-op before the mesh is connected or after a first call.
  void SignalFailure(const std::string& message);
};

class GlooState {
 public:
  GlooState(std::string name, int rank, int size, absl::Duration timeout,
            std::shared_ptr<AbortableGlooContext> context);

  const std::string& name() const { return name_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  absl::Duration timeout() const { return timeout_; }
  std::chrono::milliseconds timeout_ms() const;
  const std::shared_ptr<gloo::Context> context() const { return context_; }

  // Runs fn, which talks to Gloo, unless the communicator already failed or
  // was stopped. Converts whatever fn throws into a status naming the group
  // and op; the first failure breaks the communicator for good and closes its
  // connections so that the peers fail promptly as well.
  absl::Status Run(const std::string& op, const std::function<void()>& fn);

  void Record(const std::string& op, int64_t bytes, int64_t logical_bytes);
  CommStats Stats() const;

  // Stops the communicator: operations blocked in Gloo fail with `code` and
  // "group <g>: <op> <description>", later ones without running.
  void Interrupt(absl::StatusCode code, const std::string& description);

 private:
  absl::Status Failure(const std::string& op, GlooFailureKind kind, const std::string& what);

  const std::string name_;
  const int rank_;
  const int size_;
  const absl::Duration timeout_;
  const std::shared_ptr<AbortableGlooContext> context_;

  mutable std::mutex mu_;
  absl::Status failed_;
  std::optional<std::pair<absl::StatusCode, std::string>> interrupted_;
  CommStats stats_;
};

}  // namespace loom::comm
