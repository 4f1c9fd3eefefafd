#include "worker/engine/tensor_parallel/vocab_parallel_loss.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace loom::engine {

void VocabParallelLoss::Reserve(int64_t rows) {
  if (rows <= capacity_) return;
  capacity_ = rows;
  stats_ = ops_->AllocateFloats(2 * rows);
  gathered_ = ops_->AllocateFloats(2 * rows * coll_->size());
  lse_ = ops_->AllocateFloats(rows);
}

double VocabParallelLoss::Run(float* logits, const int32_t* targets_device,
                              const int32_t* targets_host, int64_t rows, bool backward,
                              float grad_scale) {
  Reserve(rows);
  const int n = coll_->size();
  ops_->CrossEntropyShardStats(logits, targets_device, rows, vocab_first_, vocab_, stats_.f32(),
                               stats_.f32() + rows);
  coll_->AllGather(stats_.f32(), 2 * rows, gathered_.f32());
  host_gathered_.resize(static_cast<size_t>(2 * rows * n));
  host_lse_.resize(static_cast<size_t>(rows));
  ops_->CopyDeviceToHost(host_gathered_.data(), gathered_.f32(),
                         2 * rows * n * static_cast<int64_t>(sizeof(float)));
  double loss_sum = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    // Shard s's numbers sit at [s * 2 rows + r] (lse) and [s * 2 rows + rows + r].
    double max_lse = -std::numeric_limits<double>::infinity();
    for (int s = 0; s < n; ++s) max_lse = std::max(max_lse, double(host_gathered_[s * 2 * rows + r]));
    double sum = 0.0, target_logit = 0.0;
    for (int s = 0; s < n; ++s) {
      sum += std::exp(double(host_gathered_[s * 2 * rows + r]) - max_lse);
      target_logit += host_gathered_[s * 2 * rows + rows + r];  // one shard holds the target
    }
    const double lse = max_lse + std::log(sum);
    host_lse_[static_cast<size_t>(r)] = static_cast<float>(lse);
    if (targets_host[r] >= 0) loss_sum += lse - target_logit;
  }
  if (backward) {
    ops_->CopyHostToDevice(lse_.f32(), host_lse_.data(), rows * static_cast<int64_t>(sizeof(float)));
    ops_->CrossEntropyShardBackward(logits, targets_device, rows, vocab_first_, vocab_, lse_.f32(),
                                    grad_scale);
  }
  return loss_sum;
}

}  // namespace loom::engine
