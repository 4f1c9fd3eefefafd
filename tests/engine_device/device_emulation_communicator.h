// A Communicator for tests that accepts only DeviceEmulationOps memory, the
// way NCCL accepts only device memory: every span handed to it must be a
// tagged (backend) address range inside one live allocation of the rank's
// DeviceEmulationOps, or the process aborts naming the operation and the
// argument. Valid spans are translated to their host addresses and forwarded
// to a real communicator (Gloo, or any test group), so the numbers and the
// counters are the inner communicator's. Engine code that hands host memory
// to a collective, or reads a buffer the collective wrote on the host, thus
// fails a test on a machine without a device.
#pragma once

#include <atomic>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tests/engine_device/device_emulation_ops.h"
#include "worker/comm/communicator.h"

namespace loom::engine::testing {

class DeviceEmulationCommunicator final : public comm::Communicator {
 public:
  // Forwards to `inner`, owned; `ops` (not owned) must outlive this.
  DeviceEmulationCommunicator(std::unique_ptr<comm::Communicator> inner,
                              const DeviceEmulationOps* ops);
  // Forwards to `inner`, not owned; both must outlive this.
  DeviceEmulationCommunicator(comm::Communicator* inner, const DeviceEmulationOps* ops);

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }

  absl::Status AllReduce(std::span<float> data,
                         comm::ReduceOp op = comm::ReduceOp::kSum) override;
  std::unique_ptr<comm::Work> AllReduceAsync(
      std::span<float> data, comm::ReduceOp op = comm::ReduceOp::kSum) override;
  absl::Status ReduceScatter(std::span<const float> in, std::span<float> out) override;
  absl::Status AllGather(std::span<const float> in, std::span<float> out) override;
  absl::Status Broadcast(std::span<float> data, int root) override;
  absl::Status Send(std::span<const float> data, int peer, uint32_t tag) override;
  absl::Status Recv(std::span<float> data, int peer, uint32_t tag) override;
  std::unique_ptr<comm::Work> SendAsync(std::span<const float> data, int peer,
                                        uint32_t tag) override;
  std::unique_ptr<comm::Work> RecvAsync(std::span<float> data, int peer, uint32_t tag) override;
  absl::Status AllToAll(std::span<const float> in, const std::vector<int64_t>& send_counts,
                        std::span<float> out, const std::vector<int64_t>& recv_counts) override;
  absl::Status AllToAllInt64(std::span<const int64_t> in, std::span<int64_t> out) override;
  absl::Status Barrier() override { return inner_->Barrier(); }

  comm::CommStats Stats() const override { return inner_->Stats(); }
  void Abort(const std::string& reason) override { inner_->Abort(reason); }
  comm::CommProgress Progress() const override { return inner_->Progress(); }

  // Operations whose spans were checked and forwarded (tests assert the
  // device path really communicated).
  int64_t forwarded() const { return forwarded_.load(); }

 private:
  // The host view of a span that must be backend memory; aborts otherwise.
  template <typename T>
  std::span<T> Host(std::span<T> s, const char* op, const char* arg);

  std::unique_ptr<comm::Communicator> owned_;
  comm::Communicator* inner_;
  const DeviceEmulationOps* ops_;
  std::atomic<int64_t> forwarded_{0};
};

// Wraps each communicator of a group; ops[r] is rank r's backend.
std::vector<std::unique_ptr<comm::Communicator>> WrapGroup(
    std::vector<std::unique_ptr<comm::Communicator>> group,
    const std::vector<const DeviceEmulationOps*>& ops);

}  // namespace loom::engine::testing
