// The engine's own memory accounting: bytes of parameters, gradients,
// optimizer states, activations and communication buffers that one rank holds,
// current and peak. The data-parallel engine reports what it materializes and
// releases (ZeRO shards, gathered blocks, reduction staging), so the peak per
// rank can be compared across ZeRO stages independently of the process RSS
// (which, with ranks as threads, is shared). Thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <string>

namespace loom::engine {

enum class MemoryKind { kParameters, kGradients, kOptimizerStates, kActivations, kCommBuffers };
inline constexpr int kNumMemoryKinds = 5;
const char* MemoryKindName(MemoryKind kind);  // "parameters", "gradients", ...

struct MemoryUsage {
  std::array<int64_t, kNumMemoryKinds> current{};
  std::array<int64_t, kNumMemoryKinds> peak{};  // each kind's own peak
  int64_t total_current = 0;
  int64_t total_peak = 0;  // peak of the sum (not the sum of the peaks)

  int64_t Current(MemoryKind k) const { return current[static_cast<int>(k)]; }
  int64_t Peak(MemoryKind k) const { return peak[static_cast<int>(k)]; }
};

class MemoryTracker {
 public:
  void Add(MemoryKind kind, int64_t bytes);
  void Sub(MemoryKind kind, int64_t bytes);
  // Sets a kind's current bytes (for buffers another component owns and
  // reports as a total, such as the model's activations).
  void Set(MemoryKind kind, int64_t bytes);
  MemoryUsage Snapshot() const;
  // Restarts the peaks from the current values (e.g. after setup).
  void ResetPeaks();

 private:
  void UpdatePeaksLocked();
  mutable std::mutex mu_;
  MemoryUsage usage_;
};

// One line per kind plus the total, in MiB with three decimals.
std::string FormatMemoryUsage(const MemoryUsage& usage);

}  // namespace loom::engine
