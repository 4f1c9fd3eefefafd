#include "worker/engine/grad_reducer.h"

#include <algorithm>
#include <cstring>
#include <memory>

namespace loom::engine {

GradientReducer::GradientReducer(std::vector<TensorView> grads, int64_t bucket_bytes)
    : grads_(std::move(grads)) {
  const int64_t bucket_floats = std::max<int64_t>(1, bucket_bytes / 4);
  int64_t offset = 0;
  Bucket current;
  for (size_t i = 0; i < grads_.size(); ++i) {
    const int64_t n = grads_[i].numel();
    if (current.size > 0 && current.size + n > bucket_floats) {
      buckets_.push_back(current);
      current = Bucket{i, i, offset, 0};
    }
    current.end_tensor = i + 1;
    current.size += n;
    offset += n;
  }
  if (current.size > 0) buckets_.push_back(current);
  flat_.resize(static_cast<size_t>(offset));
}

absl::Status GradientReducer::AllReduceSum(comm::Communicator& comm) {
  std::vector<std::unique_ptr<comm::Work>> pending;
  pending.reserve(buckets_.size());
  for (const Bucket& b : buckets_) {
    float* dst = flat_.data() + b.offset;
    for (size_t i = b.first_tensor; i < b.end_tensor; ++i) {
      std::memcpy(dst, grads_[i].data, static_cast<size_t>(grads_[i].numel()) * 4);
      dst += grads_[i].numel();
    }
    pending.push_back(comm.AllReduceAsync(
        std::span<float>(flat_.data() + b.offset, static_cast<size_t>(b.size)),
        comm::ReduceOp::kSum));
  }
  absl::Status status;
  for (auto& w : pending) status.Update(w->Wait());  // wait for all even after a failure
  if (!status.ok()) return status;
  for (const Bucket& b : buckets_) {
    const float* src = flat_.data() + b.offset;
    for (size_t i = b.first_tensor; i < b.end_tensor; ++i) {
      std::memcpy(grads_[i].data, src, static_cast<size_t>(grads_[i].numel()) * 4);
      src += grads_[i].numel();
    }
  }
  return absl::OkStatus();
}

}  // namespace loom::engine
