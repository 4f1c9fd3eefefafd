#include "coordinator/service/scheduler_metrics.h"

#include "absl/strings/str_cat.h"

namespace loom::coordinator {
namespace {

prometheus::Family<prometheus::Gauge>& Gauge(prometheus::Registry& r, const char* name,
                                             const char* help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(r);
}

prometheus::Labels UserKind(const std::pair<std::string, std::string>& key) {
  return {{"user", key.first}, {"kind", key.second}};
}

}  // namespace

SchedulerMetrics::SchedulerMetrics(prometheus::Registry& registry)
    : waiting_(Gauge(registry, "loom_queue_jobs", "Jobs waiting to be placed, by device kind")),
      oldest_wait_(Gauge(registry, "loom_queue_oldest_wait_seconds",
                         "The longest a waiting job of each priority has waited since it was "
                         "submitted")),
      held_(Gauge(registry, "loom_user_devices_held", "Devices a user's jobs hold, by kind")),
      quota_(Gauge(registry, "loom_user_devices_quota",
                   "Devices of a kind a user may hold at once (loomctl quota)")) {
  for (const char* kind : {"cpu", "gpu"}) waiting_.Add({{"kind", kind}}).Set(0);
}

void SchedulerMetrics::Set(const QueueSample& sample) {
  absl::MutexLock lock(&mu_);
  for (const char* kind : {"cpu", "gpu"}) {
    auto it = sample.waiting_by_kind.find(kind);
    waiting_.Add({{"kind", kind}}).Set(it == sample.waiting_by_kind.end() ? 0 : it->second);
  }
  for (const auto& [priority, seconds] : last_.oldest_wait_s_by_priority) {
    if (sample.oldest_wait_s_by_priority.count(priority) == 0) {
      oldest_wait_.Remove(&oldest_wait_.Add({{"priority", absl::StrCat(priority)}}));
    }
  }
  for (const auto& [priority, seconds] : sample.oldest_wait_s_by_priority) {
    oldest_wait_.Add({{"priority", absl::StrCat(priority)}}).Set(seconds);
  }
  for (const auto& [key, devices] : last_.held) {
    if (sample.held.count(key) == 0) held_.Remove(&held_.Add(UserKind(key)));
  }
  for (const auto& [key, devices] : sample.held) held_.Add(UserKind(key)).Set(devices);
  for (const auto& [key, devices] : last_.quota) {
    if (sample.quota.count(key) == 0) quota_.Remove(&quota_.Add(UserKind(key)));
  }
  for (const auto& [key, devices] : sample.quota) quota_.Add(UserKind(key)).Set(devices);
  last_ = sample;
}

}  // namespace loom::coordinator
