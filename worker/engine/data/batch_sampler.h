// Which tokens each rank trains and evaluates on. Training windows are a pure
// function of (seed, step, index), so any step's batch can be rebuilt from the
// step number alone (resume needs no sampler state) and every data-parallel
// size sees the same global batch: ranks and micro-batches take disjoint
// contiguous slices of it. The exact definitions are in docs/engine.md.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "worker/engine/data/token_dataset.h"

namespace loom::engine {

// batch sequences of seq tokens each, row-major; targets are inputs shifted by one.
struct Batch {
  int64_t batch = 0;
  int64_t seq = 0;
  std::vector<int32_t> inputs;
  std::vector<int32_t> targets;
};

// The counter-based hash behind sampling: splitmix64 finalizer chained over
// seed, step and index.
uint64_t WindowHash(uint64_t seed, int64_t step, int64_t index);

class TrainSampler {
 public:
  // data must outlive the sampler and hold at least seq_len + 1 tokens.
  TrainSampler(const TokenDataset* data, uint64_t seed, int64_t seq_len);

  // Start of window `index` (0 <= index < global batch) of optimizer step
  // `step` (1-based): a value in [0, size - seq_len - 1].
  int64_t WindowStart(int64_t step, int64_t index) const;
  // Sequences [first, first + count) of step's global batch.
  void Fill(int64_t step, int64_t first, int64_t count, Batch* out) const;

 private:
  const TokenDataset* data_;
  uint64_t seed_;
  int64_t seq_len_;
};

// The first sequence of micro-batch `micro` on DP rank `dp_rank`: rank r owns
// sequences [r*G/dp, (r+1)*G/dp), cut into micro-batches in order.
int64_t MicroBatchFirst(int64_t global_batch, int64_t dp_size, int64_t dp_rank,
                        int64_t micro_batch, int64_t micro);

// Validation window i is tokens [i*S, i*S + S]: inputs i*S .. i*S+S-1, targets
// shifted by one. Fills windows [first, first + count).
void FillValidationWindows(const TokenDataset& data, int64_t seq_len, int64_t first,
                           int64_t count, Batch* out);

// OK when the dataset holds `windows` validation windows of seq_len (needs
// windows*seq_len + 1 tokens); otherwise an error naming the file.
absl::Status CheckValidationSize(const TokenDataset& data, int64_t seq_len, int64_t windows);
// OK when the dataset holds at least one training window (seq_len + 1 tokens).
absl::Status CheckTrainSize(const TokenDataset& data, int64_t seq_len);

}  // namespace loom::engine
