#include "worker/comm/timed_communicator.h"

#include <algorithm>
#include <utility>

namespace loom::comm {
namespace {

// An asynchronous call's handle: the caller is blocked only in Wait, and
// only its first Wait counts (later ones return at once).
class TimedWork final : public Work {
 public:
  TimedWork(std::unique_ptr<Work> inner, std::shared_ptr<CollectiveClock> clock, std::string group,
            const char* op, absl::Time entered, int64_t bytes)
      : inner_(std::move(inner)), clock_(std::move(clock)), group_(std::move(group)), op_(op),
        entered_(entered), bytes_(bytes) {}

  absl::Status Wait() override {
    const absl::Time begin = absl::Now();
    absl::Status status = inner_->Wait();
    if (!recorded_) {
      recorded_ = true;
      // On a device its own measure: the host's wait also holds the
      // caller's kernels queued before it.
      const std::optional<absl::Duration> device = status.ok() ? inner_->DeviceTime() : std::nullopt;
      clock_->Record(group_, op_, entered_, device.value_or(absl::Now() - begin), bytes_);
    }
    return status;
  }

 private:
  std::unique_ptr<Work> inner_;
  std::shared_ptr<CollectiveClock> clock_;
  std::string group_;
  const char* op_;
  absl::Time entered_;
  int64_t bytes_;
  bool recorded_ = false;
};

}  // namespace

TimedCommunicator::TimedCommunicator(std::unique_ptr<Communicator> inner,
                                     std::shared_ptr<CollectiveClock> clock)
    : inner_(std::move(inner)), clock_(std::move(clock)) {}

// A call's payload on this rank, as `loomctl trace` shows it: what it sends
// or receives (the larger side of a gather or scatter).
static int64_t FloatBytes(size_t count) { return static_cast<int64_t>(count * sizeof(float)); }

template <typename Fn>
absl::Status TimedCommunicator::Timed(const char* op, int64_t bytes, Fn&& fn) {
  const absl::Time entered = absl::Now();
  absl::Status status = fn();
  const absl::Duration host = absl::Now() - entered;
  const std::optional<absl::Duration> device =
      status.ok() ? inner_->LastDeviceTime() : std::nullopt;
  clock_->Record(inner_->name(), op, entered, device.value_or(host), bytes);
  return status;
}

std::unique_ptr<Work> TimedCommunicator::TimedAsync(const char* op, int64_t bytes,
                                                    std::unique_ptr<Work> work, absl::Time entered) {
  return std::make_unique<TimedWork>(std::move(work), clock_, inner_->name(), op, entered, bytes);
}

absl::Status TimedCommunicator::AllReduce(std::span<float> data, ReduceOp op) {
  return Timed("all_reduce", FloatBytes(data.size()), [&] { return inner_->AllReduce(data, op); });
}

std::unique_ptr<Work> TimedCommunicator::AllReduceAsync(std::span<float> data, ReduceOp op) {
  const absl::Time entered = absl::Now();
  return TimedAsync("all_reduce", FloatBytes(data.size()), inner_->AllReduceAsync(data, op), entered);
}

absl::Status TimedCommunicator::ReduceScatter(std::span<const float> in, std::span<float> out) {
  return Timed("reduce_scatter", FloatBytes(std::max(in.size(), out.size())), [&] { return inner_->ReduceScatter(in, out); });
}

absl::Status TimedCommunicator::AllGather(std::span<const float> in, std::span<float> out) {
  return Timed("all_gather", FloatBytes(std::max(in.size(), out.size())), [&] { return inner_->AllGather(in, out); });
}

absl::Status TimedCommunicator::Broadcast(std::span<float> data, int root) {
  return Timed("broadcast", FloatBytes(data.size()), [&] { return inner_->Broadcast(data, root); });
}

absl::Status TimedCommunicator::Send(std::span<const float> data, int peer, uint32_t tag) {
  return Timed("send", FloatBytes(data.size()), [&] { return inner_->Send(data, peer, tag); });
}

absl::Status TimedCommunicator::Recv(std::span<float> data, int peer, uint32_t tag) {
  return Timed("recv", FloatBytes(data.size()), [&] { return inner_->Recv(data, peer, tag); });
}

absl::Status TimedCommunicator::AllToAll(std::span<const float> in,
                                         const std::vector<int64_t>& send_counts,
                                         std::span<float> out,
                                         const std::vector<int64_t>& recv_counts) {
  return Timed("all_to_all", FloatBytes(std::max(in.size(), out.size())), [&] { return inner_->AllToAll(in, send_counts, out, recv_counts); });
}

absl::Status TimedCommunicator::Barrier() {
  return Timed("barrier", 0, [&] { return inner_->Barrier(); });
}

absl::Status TimedCommunicator::AllToAllInt64(std::span<const int64_t> in, std::span<int64_t> out) {
  return Timed("all_to_all_int64", static_cast<int64_t>(std::max(in.size(), out.size()) * sizeof(int64_t)), [&] { return inner_->AllToAllInt64(in, out); });
}

std::unique_ptr<Work> TimedCommunicator::SendAsync(std::span<const float> data, int peer,
                                                   uint32_t tag) {
  const absl::Time entered = absl::Now();
  return TimedAsync("send", FloatBytes(data.size()), inner_->SendAsync(data, peer, tag), entered);
}

std::unique_ptr<Work> TimedCommunicator::RecvAsync(std::span<float> data, int peer, uint32_t tag) {
  const absl::Time entered = absl::Now();
  return TimedAsync("recv", FloatBytes(data.size()), inner_->RecvAsync(data, peer, tag), entered);
}

}  // namespace loom::comm
