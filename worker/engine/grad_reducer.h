// Data-parallel gradient reduction of arbitrary (not necessarily contiguous)
// tensors after backward: sums every gradient over the DP group in buckets of
// about parallelism.bucket_mb, so each collective is large enough to be
// efficient and buckets travel while later ones are still being packed. The
// training loop uses DataParallelEngine (zero/dp_engine.h) instead, which
// launches each bucket during backward and implements the ZeRO stages.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "worker/comm/communicator.h"
#include "worker/engine/tensor_view.h"

namespace loom::engine {

class GradientReducer {
 public:
  // grads' storage must outlive the reducer. A tensor larger than a bucket
  // gets a bucket of its own.
  GradientReducer(std::vector<TensorView> grads, int64_t bucket_bytes);

  // Replaces every gradient with its sum over comm's ranks.
  absl::Status AllReduceSum(comm::Communicator& comm);

  int64_t num_buckets() const { return static_cast<int64_t>(buckets_.size()); }

 private:
  struct Bucket {
    size_t first_tensor = 0;
    size_t end_tensor = 0;
    int64_t offset = 0;  // into flat_
    int64_t size = 0;
  };
  std::vector<TensorView> grads_;
  std::vector<Bucket> buckets_;
  std::vector<float> flat_;
};

}  // namespace loom::engine
