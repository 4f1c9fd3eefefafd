#include "coordinator/cluster/node_registry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace loom::coordinator {
namespace {

// Beyond this the coordinator is too far behind to judge liveness at all.
constexpr absl::Duration kMaxLagCredit = absl::Seconds(60);

}  // namespace

void NodeRegistry::Register(const loom::v1::RegisterNode& registration,
                            std::shared_ptr<NodeChannel> channel, absl::Time now) {
  absl::MutexLock lock(&mu_);
  RegisterLocked(registration, std::move(channel), now);
}

void NodeRegistry::RegisterLocked(const loom::v1::RegisterNode& registration,
                                  std::shared_ptr<NodeChannel> channel, absl::Time now) {
  Entry& entry = nodes_[registration.node_id()];
  NodeInfo& info = entry.info;
  info.node_id = registration.node_id();
  info.hostname = registration.hostname();
  info.spare = registration.spare();
  info.labels = {registration.labels().begin(), registration.labels().end()};
  info.address = registration.address();
  info.device_count = 0;
  for (const auto& device : registration.devices()) {
    // A node offers one kind of device to jobs; the first kind listed wins.
    if (info.device_count == 0 || device.kind() == info.device_kind) {
      info.device_kind = device.kind();
      info.device_count += device.count();
      info.device_name = device.name();
      info.device_memory_bytes = device.memory_bytes();
      info.peak_flops_per_device = device.peak_flops();
    }
  }
  info.live = true;
  info.connected = true;
  info.last_seen = now;
  info.running.assign(registration.running().begin(), registration.running().end());
  if (entry.channel != channel) {  // a new session, a new clock
    entry.lag = SessionLag();
    entry.last_lag = absl::ZeroDuration();
    entry.handling_since = absl::InfinitePast();
    entry.listening_since = absl::InfinitePast();
  }
  entry.channel = std::move(channel);
  SyncBoardLocked(registration.node_id(), entry);
}

void NodeRegistry::SyncBoardLocked(const std::string& node_id, const Entry& entry) {
  if (board_ == nullptr) return;
  const liveness::Grant* grant =
      entry.channel != nullptr ? entry.channel->liveness_grant() : nullptr;
  if (entry.info.live && grant != nullptr) {
    board_->Count(node_id, *grant);
  } else {
    board_->Stop(node_id);
  }
}

bool NodeRegistry::RegisterIfFree(const loom::v1::RegisterNode& registration,
                                  std::shared_ptr<NodeChannel> channel, absl::Time now,
                                  absl::Duration alive) {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(registration.node_id());
  if (it != nodes_.end() && it->second.info.live && it->second.channel != nullptr &&
      it->second.channel != channel &&
      now - std::max(it->second.info.last_seen,
                     board_ != nullptr ? board_->HeardAt(registration.node_id())
                                       : absl::InfinitePast()) < alive) {
    return false;
  }
  RegisterLocked(registration, std::move(channel), now);
  return true;
}

NodeRegistry::HeartbeatResult NodeRegistry::Heartbeat(const std::string& node_id,
                                                      const NodeChannel* channel,
                                                      const loom::v1::Heartbeat& heartbeat,
                                                      absl::Time now) {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) return HeartbeatResult::kOrphaned;
  NodeInfo& info = it->second.info;
  if (it->second.channel.get() != channel) {
    // Another session holds the node only while it is open and the node live.
    return info.live && it->second.channel != nullptr ? HeartbeatResult::kStale
                                                      : HeartbeatResult::kOrphaned;
  }
  info.last_seen = now;
  info.running.assign(heartbeat.running().begin(), heartbeat.running().end());
  if (std::optional<absl::Duration> lag = it->second.lag.Observe(heartbeat.sent_monotonic_us(), now)) {
    backlog_.Observe(*lag, now);
    it->second.last_lag = *lag;
  }
  if (info.live) return HeartbeatResult::kAlive;
  info.live = true;
  SyncBoardLocked(node_id, it->second);
  return HeartbeatResult::kRevived;
}

bool NodeRegistry::SessionClosed(const std::string& node_id, const NodeChannel* channel) {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node_id);
  if (it == nodes_.end() || it->second.channel.get() != channel) return false;
  // Still live: lost only once silent for the node timeout (ExpireSilent),
  // from its last heartbeat.
  it->second.info.connected = false;
  it->second.channel.reset();
  SyncBoardLocked(node_id, it->second);
  return true;
}

void NodeRegistry::MessageRead(const std::string& node_id, const NodeChannel* channel,
                               absl::Time now) {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node_id);
  if (it == nodes_.end() || it->second.channel.get() != channel) return;
  it->second.info.last_seen = std::max(it->second.info.last_seen, now);
  it->second.handling_since = now;
}

void NodeRegistry::MessageHandled(const std::string& node_id, const NodeChannel* channel,
                                  absl::Time now) {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node_id);
  if (it == nodes_.end() || it->second.channel.get() != channel) return;
  it->second.handling_since = absl::InfinitePast();
  it->second.listening_since = now;
}

std::vector<std::string> NodeRegistry::ExpireSilent(absl::Time now, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  const absl::Duration backlog = backlog_.Backlog(now);
  std::vector<std::string> lost;
  for (auto& [id, entry] : nodes_) {
    const absl::Duration credit = std::min(std::max(backlog, entry.last_lag), kMaxLagCredit);
    if (entry.handling_since != absl::InfinitePast() &&
        now - entry.handling_since <= kMaxLagCredit) {
      continue;  // the coordinator is busy with its message, not waiting for one
    }
    absl::Time quiet_since = std::max(entry.info.last_seen, entry.listening_since);
    if (board_ != nullptr) quiet_since = std::max(quiet_since, board_->HeardAt(id));
    if (entry.info.live && now - quiet_since > timeout + credit) {
      // An open session's channel stays: a heartbeat on it revives the node.
      entry.info.live = false;
      SyncBoardLocked(id, entry);
      lost.push_back(id);
    }
  }
  return lost;
}

absl::Duration NodeRegistry::HeartbeatBacklog(absl::Time now) {
  absl::MutexLock lock(&mu_);
  return backlog_.Backlog(now);
}

bool NodeRegistry::Send(const std::string& node_id, const loom::v1::CoordinatorMessage& message) {
  std::shared_ptr<NodeChannel> channel;
  {
    absl::MutexLock lock(&mu_);
    auto it = nodes_.find(node_id);
    if (it == nodes_.end() || !it->second.info.live) return false;
    channel = it->second.channel;
  }
  if (!channel) return false;
  channel->Send(message);
  return true;
}

std::optional<NodeInfo> NodeRegistry::Get(const std::string& node_id) const {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) return std::nullopt;
  return it->second.info;
}

std::vector<NodeInfo> NodeRegistry::LiveNodes() const {
  absl::MutexLock lock(&mu_);
  std::vector<NodeInfo> live;
  for (const auto& [id, entry] : nodes_) {
    if (entry.info.live) live.push_back(entry.info);
  }
  return live;
}

std::vector<NodeInfo> NodeRegistry::AllNodes() const {
  absl::MutexLock lock(&mu_);
  std::vector<NodeInfo> all;
  for (const auto& [id, entry] : nodes_) all.push_back(entry.info);
  return all;
}

NodeCounts NodeRegistry::Counts() const {
  absl::MutexLock lock(&mu_);
  NodeCounts counts;
  for (const auto& [id, entry] : nodes_) {
    const NodeInfo& info = entry.info;
    if (info.cordoned) ++counts.cordoned;
    counts.all_devices[info.device_kind] += info.device_count;
    if (!info.live) continue;
    ++counts.live;
    counts.live_devices[info.device_kind] += info.device_count;
  }
  return counts;
}

bool NodeRegistry::Cordon(const std::string& node_id, const std::string& reason, absl::Time now) {
  absl::MutexLock lock(&mu_);
  NodeInfo& info = nodes_[node_id].info;
  info.node_id = node_id;
  if (info.cordoned) return false;
  info.cordoned = true;
  info.cordon_reason = reason;
  info.cordoned_at = now;
  return true;
}

absl::StatusOr<NodeInfo*> NodeRegistry::KnownLocked(const std::string& node_id) {
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) {
    return absl::NotFoundError(
        absl::StrCat("node ", node_id, " is not known (loomctl nodes lists them)"));
  }
  return &it->second.info;
}

void NodeRegistry::ClearCordon(NodeInfo& info) {
  info.cordoned = false;
  info.draining = false;
  info.cordon_reason.clear();
  info.cordoned_at = absl::InfinitePast();
}

absl::Status NodeRegistry::Drain(const std::string& node_id, const std::string& reason,
                                 absl::Time now) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<NodeInfo*> known = KnownLocked(node_id);
  if (!known.ok()) return known.status();
  NodeInfo& info = **known;
  info.draining = true;
  info.cordoned = true;
  info.cordon_reason = reason;
  info.cordoned_at = now;
  return absl::OkStatus();
}

absl::Status NodeRegistry::Uncordon(const std::string& node_id) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<NodeInfo*> known = KnownLocked(node_id);
  if (!known.ok()) return known.status();
  if (!(*known)->cordoned) {
    return absl::FailedPreconditionError(absl::StrCat("node ", node_id, " is not cordoned"));
  }
  ClearCordon(**known);
  return absl::OkStatus();
}

std::vector<std::string> NodeRegistry::ExpireCordons(absl::Time now, absl::Duration ttl) {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> lifted;
  for (auto& [id, entry] : nodes_) {
    NodeInfo& info = entry.info;
    if (info.cordoned && !info.draining && now - info.cordoned_at >= ttl) {
      ClearCordon(info);
      lifted.push_back(id);
    }
  }
  return lifted;
}

}  // namespace loom::coordinator
