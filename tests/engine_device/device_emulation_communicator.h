// A Communicator for tests that accepts only DeviceEmulationOps memory, the
// way NCCL accepts only device memory: every span handed to it must be a
// tagged (backend) address range inside one live allocation of the rank's
// DeviceEmulationOps, or the process aborts naming the operation and the
// argument. Valid spans are translated to their host addresses and forwarded
// to a real communicator (Gloo, or any test group), so the numbers and the
// counters are the inner communicator's. Engine code that hands host memory
// to a collective, or reads a buffer the collective wrote on the host, thus
// fails a test on a machine without a device.
//
// Point-to-point posts follow NCCL's launch rule too (worker/comm/
// nccl_communicator.h): SendAsync/RecvAsync are held, and the batch reaches
// the inner communicator only at StartPosted, the first Wait of one of its
// works, or the next collective. So a caller that waits without starting sees
// its transfers begin only at the wait, as on a GPU, and the op trace
// (set_trace) shows what ran while each batch was in flight.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "tests/engine_device/device_emulation_ops.h"
#include "tests/engine_device/op_trace.h"
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
  absl::Status Barrier() override;
  void StartPosted() override;

  comm::CommStats Stats() const override { return inner_->Stats(); }
  void Abort(const std::string& reason) override { inner_->Abort(reason); }
  comm::CommProgress Progress() const override { return inner_->Progress(); }

  // Operations whose spans were checked and forwarded (tests assert the
  // device path really communicated).
  int64_t forwarded() const { return forwarded_.load(); }

  // Records "start <n>" when the n-th batch of posts (counting from 0) goes
  // to the inner communicator and "wait <n>" at the first Wait on one of its
  // works; nullptr stops. Not owned.
  void set_trace(OpTrace* trace) { trace_.store(trace); }

  // A posted transfer held until its batch starts.
  struct Held;
  // Sends the held posts to the inner communicator, in posting order.
  void StartHeld();
  void TraceEvent(const std::string& event) {
    if (OpTrace* t = trace_.load()) t->Add(event);
  }

 private:
  // Holds a point-to-point transfer (host view) until its batch starts.
  std::unique_ptr<comm::Work> Hold(bool send, std::span<float> host, int peer, uint32_t tag);
  // The host view of a span that must be backend memory; aborts otherwise.
  template <typename T>
  std::span<T> Host(std::span<T> s, const char* op, const char* arg);

  std::unique_ptr<comm::Communicator> owned_;
  comm::Communicator* inner_;
  const DeviceEmulationOps* ops_;
  std::atomic<int64_t> forwarded_{0};
  std::atomic<OpTrace*> trace_{nullptr};
  std::mutex held_mu_;
  std::vector<std::shared_ptr<Held>> held_;  // the open batch
  int64_t batches_ = 0;                      // batches started so far
};

// Wraps each communicator of a group; ops[r] is rank r's backend.
std::vector<std::unique_ptr<comm::Communicator>> WrapGroup(
    std::vector<std::unique_ptr<comm::Communicator>> group,
    const std::vector<const DeviceEmulationOps*>& ops);

}  // namespace loom::engine::testing
