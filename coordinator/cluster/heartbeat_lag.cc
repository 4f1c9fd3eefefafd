#include "coordinator/cluster/heartbeat_lag.h"

#include <algorithm>
#include <vector>

namespace loom::coordinator {
namespace {

// Bounds memory whatever the node count: 2 s of 32,768 nodes' heartbeats.
constexpr size_t kMaxSamples = 65536;

}  // namespace

std::optional<absl::Duration> SessionLag::Observe(int64_t sent_monotonic_us, absl::Time read) {
  if (sent_monotonic_us <= 0) return std::nullopt;
  const int64_t offset = absl::ToUnixMicros(read) - sent_monotonic_us;
  if (!min_offset_us_ || offset < *min_offset_us_) min_offset_us_ = offset;
  return absl::Microseconds(offset - *min_offset_us_);
}

HeartbeatLag::HeartbeatLag(absl::Duration window, absl::Duration max_credit)
    : window_(window), max_credit_(max_credit) {}

void HeartbeatLag::Observe(absl::Duration lag, absl::Time read) {
  samples_.emplace_back(read, lag);
  if (samples_.size() > kMaxSamples) samples_.pop_front();
  Prune(read);
}

absl::Duration HeartbeatLag::Backlog(absl::Time now) {
  Prune(now);
  if (samples_.empty()) return absl::ZeroDuration();
  std::vector<absl::Duration> lags;
  lags.reserve(samples_.size());
  for (const auto& [read, lag] : samples_) lags.push_back(lag);
  // The slowest tenth is left out (of ten lags, the ninth is taken).
  auto p90 = lags.begin() + static_cast<std::ptrdiff_t>((lags.size() - 1) * 9 / 10);
  std::nth_element(lags.begin(), p90, lags.end());
  return std::min(*p90, max_credit_);
}

void HeartbeatLag::Prune(absl::Time now) {
  while (!samples_.empty() && now - samples_.front().first > window_) samples_.pop_front();
}

}  // namespace loom::coordinator
