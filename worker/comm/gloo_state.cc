#include "worker/comm/gloo_state.h"

#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gloo/common/error.h"
#include "gloo/common/logging.h"
#include "gloo/transport/tcp/context.h"

namespace loom::comm {
namespace {

// tcp::Context::signalException (what Gloo itself calls when a wait times
// out) is protected. A pointer to it named through a derived class is the
// standard-conforming way to reach a protected member.
class TcpContextAccess : public gloo::transport::tcp::Context {
 public:
  static void Signal(gloo::transport::tcp::Context& context, const std::string& message) {
    void (gloo::transport::tcp::Context::*signal)(const std::string&) = &TcpContextAccess::signalException;
    (context.*signal)(message);
  }
};

}  // namespace

void AbortableGlooContext::SignalFailure(const std::string& message) {
  // Only the TCP transport is ever created (CreateGlooCommunicator).
  auto* tcp = static_cast<gloo::transport::tcp::Context*>(transportContext_.get());
  if (tcp == nullptr) return;
  try {
    TcpContextAccess::Signal(*tcp, message);
  } catch (const std::exception&) {
    // Already failed: the pairs keep their first error.
  }
}

GlooState::GlooState(std::string name, int rank, int size, absl::Duration timeout,
                     std::shared_ptr<AbortableGlooContext> context)
    : name_(std::move(name)), rank_(rank), size_(size), timeout_(timeout), context_(std::move(context)) {}

std::chrono::milliseconds GlooState::timeout_ms() const {
  return std::chrono::milliseconds(std::max<int64_t>(1, absl::ToInt64Milliseconds(timeout_)));
}

absl::Status GlooState::Run(const std::string& op, const std::function<void()>& fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (interrupted_.has_value()) {
      return absl::Status(interrupted_->first, absl::StrCat("group ", name_, ": ", op,
                                                            " not run: the communicator was stopped: ",
                                                            interrupted_->second));
    }
    if (!failed_.ok()) {
      return absl::Status(failed_.code(), absl::StrCat("group ", name_, ": ", op,
                                                       " not run: the communicator failed earlier: ",
                                                       failed_.message()));
    }
  }
  try {
    fn();
    return absl::OkStatus();
  } catch (const gloo::IoException& e) {
    return Failure(op, GlooFailureKind::kIo, e.what());
  } catch (const gloo::EnforceNotMet& e) {
    return Failure(op, GlooFailureKind::kOther, e.what());
  } catch (const std::exception& e) {
    return Failure(op, GlooFailureKind::kOther, e.what());
  } catch (...) {
    return Failure(op, GlooFailureKind::kOther, "unknown exception");
  }
}

absl::Status GlooState::Failure(const std::string& op, GlooFailureKind kind, const std::string& what) {
  absl::Status status;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (interrupted_.has_value()) {
      status = absl::Status(interrupted_->first, absl::StrCat("group ", name_, ": ", op, " ", interrupted_->second));
    } else {
      status = GlooFailureToStatus(name_, op, kind, what, timeout_);
    }
    if (failed_.ok()) failed_ = status;
  }
  context_->SignalFailure(absl::StrCat("loom: group ", name_, " failed: ", status.message()));
  return status;
}

void GlooState::Record(const std::string& op, int64_t bytes, int64_t logical_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  OpCounters& counters = stats_[op];
  counters.calls += 1;
  counters.bytes += bytes;
  counters.logical_bytes += logical_bytes;
}

CommStats GlooState::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void GlooState::Interrupt(absl::StatusCode code, const std::string& description) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (interrupted_.has_value()) return;
    interrupted_.emplace(code, description);
  }
  context_->SignalFailure(absl::StrCat("loom: group ", name_, " stopped: ", description));
}

}  // namespace loom::comm
