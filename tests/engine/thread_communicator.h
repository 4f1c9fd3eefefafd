// An in-process Communicator over threads, for data-parallel tests of the
// training loop without sockets: AllReduce (sum, in rank order, so results are
// deterministic), Broadcast, AllGather (the checkpoint's digests) and Barrier.
// Other operations are UNIMPLEMENTED.
#pragma once

#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "worker/comm/communicator.h"

namespace loom::engine::testing {

class ThreadGroup {
 public:
  explicit ThreadGroup(int size) : size_(size), ptrs_(static_cast<size_t>(size)) {}
  int size() const { return size_; }

  // Every rank calls with its buffer; the last to arrive combines them.
  template <typename Combine>
  void Rendezvous(int rank, float* data, Combine combine) {
    std::unique_lock<std::mutex> lock(mu_);
    ptrs_[static_cast<size_t>(rank)] = data;
    const int64_t generation = generation_;
    if (++arrived_ == size_) {
      combine(ptrs_);
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return generation_ != generation; });
    }
  }

 private:
  int size_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  int64_t generation_ = 0;
  std::vector<float*> ptrs_;
};

class ThreadCommunicator : public comm::Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<ThreadGroup> group, int rank)
      : group_(std::move(group)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  const std::string& name() const override { return name_; }

  absl::Status AllReduce(std::span<float> data, comm::ReduceOp op) override {
    const size_t n = data.size();
    group_->Rendezvous(rank_, data.data(), [n](std::vector<float*>& ptrs) {
      std::vector<float> sum(ptrs[0], ptrs[0] + n);
      for (size_t r = 1; r < ptrs.size(); ++r) {
        for (size_t i = 0; i < n; ++i) sum[i] += ptrs[r][i];
      }
      for (float* p : ptrs) std::memcpy(p, sum.data(), n * 4);
    });
    return absl::OkStatus();
  }
  std::unique_ptr<comm::Work> AllReduceAsync(std::span<float> data, comm::ReduceOp op) override {
    return std::make_unique<comm::DoneWork>(AllReduce(data, op));
  }
  absl::Status Broadcast(std::span<float> data, int root) override {
    const size_t n = data.size();
    group_->Rendezvous(rank_, data.data(), [n, root](std::vector<float*>& ptrs) {
      for (float* p : ptrs) {
        if (p != ptrs[static_cast<size_t>(root)]) std::memcpy(p, ptrs[static_cast<size_t>(root)], n * 4);
      }
    });
    return absl::OkStatus();
  }
  absl::Status Barrier() override {
    group_->Rendezvous(rank_, nullptr, [](std::vector<float*>&) {});
    return absl::OkStatus();
  }
  absl::Status ReduceScatter(std::span<const float>, std::span<float>) override { return No(); }
  absl::Status AllGather(std::span<const float> in, std::span<float> out) override {
    // Each rank's input and output side by side in one rendezvous buffer list:
    // rank r publishes its output; the inputs are copied before anyone leaves.
    const size_t n = in.size();
    std::vector<float> mine(in.begin(), in.end());
    mine.resize(n + out.size());
    group_->Rendezvous(rank_, mine.data(), [n](std::vector<float*>& ptrs) {
      for (float* p : ptrs) {
        for (size_t r = 0; r < ptrs.size(); ++r) std::memcpy(p + n + r * n, ptrs[r], n * 4);
      }
    });
    std::memcpy(out.data(), mine.data() + n, out.size() * 4);
    return absl::OkStatus();
  }
  absl::Status Send(std::span<const float>, int, uint32_t) override { return No(); }
  absl::Status Recv(std::span<float>, int, uint32_t) override { return No(); }
  absl::Status AllToAll(std::span<const float>, const std::vector<int64_t>&, std::span<float>,
                        const std::vector<int64_t>&) override {
    return No();
  }
  comm::CommStats Stats() const override { return {}; }

 private:
  static absl::Status No() { return absl::UnimplementedError("not in the test communicator"); }
  std::shared_ptr<ThreadGroup> group_;
  int rank_;
  std::string name_ = "dp";
};

}  // namespace loom::engine::testing
