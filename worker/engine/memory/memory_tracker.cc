#include "worker/engine/memory/memory_tracker.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace loom::engine {

const char* MemoryKindName(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kParameters: return "parameters";
    case MemoryKind::kGradients: return "gradients";
    case MemoryKind::kOptimizerStates: return "optimizer_states";
    case MemoryKind::kActivations: return "activations";
    case MemoryKind::kCommBuffers: return "comm_buffers";
  }
  return "unknown";
}

void MemoryTracker::Add(MemoryKind kind, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  usage_.current[static_cast<int>(kind)] += bytes;
  usage_.total_current += bytes;
  UpdatePeaksLocked();
}

void MemoryTracker::Sub(MemoryKind kind, int64_t bytes) { Add(kind, -bytes); }

void MemoryTracker::Set(MemoryKind kind, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t& cur = usage_.current[static_cast<int>(kind)];
  usage_.total_current += bytes - cur;
  cur = bytes;
  UpdatePeaksLocked();
}

void MemoryTracker::UpdatePeaksLocked() {
  for (int k = 0; k < kNumMemoryKinds; ++k) {
    usage_.peak[k] = std::max(usage_.peak[k], usage_.current[k]);
  }
  usage_.total_peak = std::max(usage_.total_peak, usage_.total_current);
}

MemoryUsage MemoryTracker::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return usage_;
}

void MemoryTracker::ResetPeaks() {
  std::lock_guard<std::mutex> lock(mu_);
  usage_.peak = usage_.current;
  usage_.total_peak = usage_.total_current;
}

std::string FormatMemoryUsage(const MemoryUsage& u) {
  std::string out;
  for (int k = 0; k < kNumMemoryKinds; ++k) {
    out += absl::StrFormat("%-16s current %10.3f MiB  peak %10.3f MiB\n",
                           MemoryKindName(static_cast<MemoryKind>(k)), u.current[k] / 1048576.0,
                           u.peak[k] / 1048576.0);
  }
  out += absl::StrFormat("%-16s current %10.3f MiB  peak %10.3f MiB\n", "total",
                         u.total_current / 1048576.0, u.total_peak / 1048576.0);
  return out;
}

}  // namespace loom::engine
