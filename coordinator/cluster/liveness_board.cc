#include "coordinator/cluster/liveness_board.h"

namespace loom::coordinator {

void LivenessBoard::Count(const std::string& node_id, const liveness::Grant& grant) {
  absl::MutexLock lock(&mu_);
  Entry& entry = entries_[node_id];
  if (entry.grant.session != grant.session || entry.grant.key != grant.key) {
    entry = Entry{};
    entry.grant = grant;
  }
  if (!entry.counting) entry.heard = absl::InfinitePast();
  entry.counting = true;
}

void LivenessBoard::Stop(const std::string& node_id) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(node_id);
  if (it == entries_.end()) return;
  it->second.counting = false;
}

absl::Time LivenessBoard::HeardAt(const std::string& node_id) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(node_id);
  return it == entries_.end() || !it->second.counting ? absl::InfinitePast() : it->second.heard;
}

absl::Time LivenessBoard::LastBeat(const std::string& node_id) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(node_id);
  return it == entries_.end() ? absl::InfinitePast() : it->second.heard;
}

std::optional<std::string> LivenessBoard::Accept(std::string_view bytes, absl::Time now) {
  const std::optional<liveness::Datagram> beat = liveness::Peek(bytes);
  if (!beat.has_value() || beat->kind != liveness::Kind::kBeat) {
    refused_.fetch_add(1, std::memory_order_relaxed);
    return std::nullopt;
  }
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(beat->node_id);
  if (it == entries_.end() || !it->second.counting || it->second.grant.session != beat->session ||
      beat->seq <= it->second.newest_seq || !liveness::Authentic(bytes, it->second.grant.key)) {
    refused_.fetch_add(1, std::memory_order_relaxed);
    return std::nullopt;
  }
  it->second.newest_seq = beat->seq;
  it->second.heard = std::max(it->second.heard, now);
  heard_.fetch_add(1, std::memory_order_relaxed);
  liveness::Datagram ack = *beat;
  ack.kind = liveness::Kind::kAck;
  return liveness::Seal(ack, it->second.grant.key);
}

}  // namespace loom::coordinator
