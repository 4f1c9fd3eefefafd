#include "tools/loadgen/latency.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace loom::loadgen {

void LatencyRecorder::Record(absl::Duration latency) {
  absl::MutexLock lock(&mu_);
  samples_ms_.push_back(static_cast<float>(absl::ToDoubleMilliseconds(latency)));
}

void LatencyRecorder::RecordFailure() {
  absl::MutexLock lock(&mu_);
  ++failures_;
}

int64_t LatencyRecorder::count() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(samples_ms_.size());
}

double LatencyRecorder::PercentileMs(double q) const {
  absl::MutexLock lock(&mu_);
  if (samples_ms_.empty()) return 0;
  std::vector<float> sorted = samples_ms_;
  const size_t index = std::min(sorted.size() - 1, static_cast<size_t>(q * sorted.size()));
  std::nth_element(sorted.begin(), sorted.begin() + index, sorted.end());
  return sorted[index];
}

std::string LatencyRecorder::Summary() const {
  float max = 0;
  int64_t failures = 0;
  size_t n = 0;
  {
    absl::MutexLock lock(&mu_);
    n = samples_ms_.size();
    failures = failures_;
    for (float s : samples_ms_) max = std::max(max, s);
  }
  if (n == 0) return absl::StrFormat("n=0 failed=%d", failures);
  return absl::StrFormat("n=%d failed=%d p50=%.1f ms p90=%.1f ms p99=%.1f ms max=%.1f ms", n,
                         failures, PercentileMs(0.5), PercentileMs(0.9), PercentileMs(0.99), max);
}

}  // namespace loom::loadgen
