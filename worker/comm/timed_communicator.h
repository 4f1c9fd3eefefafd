// A training group that reports to the rank's CollectiveClock how long each
// collective blocked its caller (for an asynchronous one: its Wait) and when
// the caller arrived at it, and otherwise is the group it wraps. The
// straggler detector reads these times (docs/observability.md): the rank
// that arrives last at a collective is blocked least, its peers the longest.
// On a GPU group the time is the device's (Work::DeviceTime, NCCL's events
// around the operation on its stream): the host's wait would also hold the
// rank's own kernels queued before the collective.
#pragma once

#include <memory>
#include <string>

#include "worker/comm/collective_clock.h"
#include "worker/comm/communicator.h"

namespace loom::comm {

class TimedCommunicator final : public Communicator {
 public:
  TimedCommunicator(std::unique_ptr<Communicator> inner, std::shared_ptr<CollectiveClock> clock);

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }

  absl::Status AllReduce(std::span<float> data, ReduceOp op = ReduceOp::kSum) override;
  std::unique_ptr<Work> AllReduceAsync(std::span<float> data,
                                       ReduceOp op = ReduceOp::kSum) override;
  absl::Status ReduceScatter(std::span<const float> in, std::span<float> out) override;
  absl::Status AllGather(std::span<const float> in, std::span<float> out) override;
  absl::Status Broadcast(std::span<float> data, int root) override;
  absl::Status Send(std::span<const float> data, int peer, uint32_t tag) override;
  absl::Status Recv(std::span<float> data, int peer, uint32_t tag) override;
  absl::Status AllToAll(std::span<const float> in, const std::vector<int64_t>& send_counts,
                        std::span<float> out, const std::vector<int64_t>& recv_counts) override;
  absl::Status Barrier() override;
  absl::Status AllToAllInt64(std::span<const int64_t> in, std::span<int64_t> out) override;
  CommStats Stats() const override { return inner_->Stats(); }
  std::unique_ptr<Work> SendAsync(std::span<const float> data, int peer, uint32_t tag) override;
  std::unique_ptr<Work> RecvAsync(std::span<float> data, int peer, uint32_t tag) override;
  void Abort(const std::string& reason) override { inner_->Abort(reason); }
  CommProgress Progress() const override { return inner_->Progress(); }
  std::optional<absl::Duration> LastDeviceTime() const override {
    return inner_->LastDeviceTime();
  }

 private:
  template <typename Fn>
  absl::Status Timed(const char* op, int64_t bytes, Fn&& fn);
  std::unique_ptr<Work> TimedAsync(const char* op, int64_t bytes, std::unique_ptr<Work> work,
                                   absl::Time entered);

  const std::unique_ptr<Communicator> inner_;
  const std::shared_ptr<CollectiveClock> clock_;
};

}  // namespace loom::comm
