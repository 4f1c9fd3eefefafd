#include "worker/agent/lease.h"

#include <algorithm>

namespace loom::agent {

Lease::State Lease::ObserveLocked(TimePoint now) {
  if (lease_ms_ <= 0 || now < deadline_) return State{false, generation_};
  if (!counted_) {
    counted_ = true;
    ++generation_;
    cv_.notify_all();
  }
  return State{true, generation_};
}

// Callers count a running-out first (ObserveLocked with the old deadline):
// a lease that ran out fences the ranks even when an ack renews it before
// anyone else looked.
void Lease::ExtendLocked(TimePoint until, TimePoint now) {
  deadline_ = until;
  if (now < deadline_) counted_ = false;  // running again: the next run-out counts
  cv_.notify_all();
}

void Lease::Registered(int64_t lease_ms, TimePoint sent, TimePoint now) {
  std::lock_guard lock(mu_);
  ObserveLocked(now);
  lease_ms_ = std::max<int64_t>(0, lease_ms);
  sent_.clear();  // acks of another session's heartbeats extend nothing now
  ExtendLocked(sent + std::chrono::milliseconds(lease_ms_), now);
}

void Lease::HeartbeatSent(int64_t seq, TimePoint sent) {
  std::lock_guard lock(mu_);
  sent_[seq] = sent;
  while (sent_.size() > kMaxUnacked) sent_.erase(sent_.begin());
}

void Lease::Acked(int64_t seq, TimePoint now) {
  std::lock_guard lock(mu_);
  auto it = sent_.find(seq);
  if (it == sent_.end()) return;  // not sent on this session, or forgotten
  const TimePoint until = it->second + std::chrono::milliseconds(lease_ms_);
  sent_.erase(sent_.begin(), std::next(it));
  ObserveLocked(now);
  if (lease_ms_ > 0 && until > deadline_) ExtendLocked(until, now);
}

Lease::State Lease::Observe(TimePoint now) {
  std::lock_guard lock(mu_);
  return ObserveLocked(now);
}

uint64_t Lease::generation() const {
  std::lock_guard lock(mu_);
  return generation_;
}

int64_t Lease::lease_ms() const {
  std::lock_guard lock(mu_);
  return lease_ms_;
}

Lease::TimePoint Lease::deadline() const {
  std::lock_guard lock(mu_);
  return deadline_;
}

bool Lease::WaitForExpiry(uint64_t* seen) {
  std::unique_lock lock(mu_);
  while (!stopped_) {
    ObserveLocked(Clock::now());
    if (generation_ > *seen) {
      *seen = generation_;
      return true;
    }
    if (lease_ms_ > 0 && !counted_) {
      cv_.wait_until(lock, deadline_);
    } else {
      cv_.wait(lock);  // until a registration or an ack moves the deadline
    }
  }
  return false;
}

void Lease::Stop() {
  std::lock_guard lock(mu_);
  stopped_ = true;
  cv_.notify_all();
}

LeaseWatcher::LeaseWatcher(Lease* lease, std::function<void()> on_expire)
    : lease_(lease), on_expire_(std::move(on_expire)), thread_([this] {
        uint64_t seen = lease_->generation();
        while (lease_->WaitForExpiry(&seen)) on_expire_();
      }) {}

LeaseWatcher::~LeaseWatcher() {
  lease_->Stop();
  thread_.join();
}

}  // namespace loom::agent
