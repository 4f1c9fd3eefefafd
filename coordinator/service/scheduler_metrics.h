// The queue's metrics (docs/scheduling.md, docs/metrics.md): waiting jobs by
// device kind, the longest wait at each priority, and each user's devices
// held against their quota. Set by the scheduler after each decision, on the
// coordinator's registry; a series whose priority or user is gone is removed,
// so they do not pile up. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"

namespace loom::coordinator {

struct QueueSample {
  std::map<std::string, int64_t> waiting_by_kind;
  std::map<int64_t, double> oldest_wait_s_by_priority;
  std::map<std::pair<std::string, std::string>, int64_t> held;   // (user, kind): devices
  std::map<std::pair<std::string, std::string>, int64_t> quota;  // (user, kind): limit
};

class SchedulerMetrics {
 public:
  explicit SchedulerMetrics(prometheus::Registry& registry);
  void Set(const QueueSample& sample);

 private:
  absl::Mutex mu_;
  prometheus::Family<prometheus::Gauge>& waiting_;
  prometheus::Family<prometheus::Gauge>& oldest_wait_;
  prometheus::Family<prometheus::Gauge>& held_;
  prometheus::Family<prometheus::Gauge>& quota_;
  QueueSample last_ ABSL_GUARDED_BY(mu_);
};

}  // namespace loom::coordinator
