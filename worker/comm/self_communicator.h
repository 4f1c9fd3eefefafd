// The communicator of a group of one: collectives are copies or no-ops, so
// single-rank code paths (a dp=1 axis, the standalone trainer) need no Gloo.
// Counters are kept like the Gloo communicator's, with zero bytes sent.
#pragma once

#include <mutex>
#include <string>

#include "worker/comm/communicator.h"

namespace loom::comm {

class SelfCommunicator : public Communicator {
 public:
  explicit SelfCommunicator(std::string name);

  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }

  absl::Status AllReduce(std::span<float> data, ReduceOp op = ReduceOp::kSum) override;
  std::unique_ptr<Work> AllReduceAsync(std::span<float> data, ReduceOp op = ReduceOp::kSum) override;
  absl::Status ReduceScatter(std::span<const float> in, std::span<float> out) override;
  absl::Status AllGather(std::span<const float> in, std::span<float> out) override;
  absl::Status Broadcast(std::span<float> data, int root) override;
  // A group of one has no peer: both fail with INVALID_ARGUMENT.
  absl::Status Send(std::span<const float> data, int peer, uint32_t tag) override;
  absl::Status Recv(std::span<float> data, int peer, uint32_t tag) override;
  absl::Status AllToAll(std::span<const float> in, const std::vector<int64_t>& send_counts, std::span<float> out,
                        const std::vector<int64_t>& recv_counts) override;
  absl::Status AllToAllInt64(std::span<const int64_t> in, std::span<int64_t> out) override;
  absl::Status Barrier() override;
  CommStats Stats() const override;
  void Abort(const std::string& reason) override;
  CommProgress Progress() const override;

 private:
  // Counts the call, or reports that the communicator was aborted.
  absl::Status Begin(const std::string& op, int64_t logical_bytes);
  absl::Status Invalid(const std::string& op, const std::string& rule) const;

  const std::string name_;
  mutable std::mutex mu_;
  CommStats stats_;
  int64_t calls_ = 0;
  std::string abort_reason_;
  bool aborted_ = false;
};

}  // namespace loom::comm
