// Latency samples of one kind of call, safe to record from gRPC callback
// threads, summarised as percentiles at the end of a loadgen run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace loom::loadgen {

class LatencyRecorder {
 public:
  void Record(absl::Duration latency);
  void RecordFailure();
  // "n=…, failed=…, p50=… ms, p90=… ms, p99=… ms, max=… ms" (or "n=0").
  std::string Summary() const;
  double PercentileMs(double q) const;
  int64_t count() const;

 private:
  mutable absl::Mutex mu_;
  std::vector<float> samples_ms_ ABSL_GUARDED_BY(mu_);
  int64_t failures_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace loom::loadgen
