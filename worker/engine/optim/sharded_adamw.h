// AdamW over a shard of the flattened parameters (ZeRO-1/2/3): the moments
// m and v exist only for the elements this rank owns, one contiguous array
// each, in the backend's memory (device memory on a GPU). The update of an
// element is ops->AdamW, the same arithmetic as AdamW's (on CpuOps the same
// kernel, kernels::cpu::AdamWStep), so a sharded step changes every owned
// element exactly as the unsharded one would with the same gradient.
#pragma once

#include <cstdint>
#include <vector>

#include "common/spec/job_spec.h"
#include "kernels/ops.h"

namespace loom::engine {

// A run of owned elements: param[i] -= ... using grad[i] and the moments at
// state_offset + i; decay says whether weight decay applies (matrices only).
// param and grad are backend memory.
struct AdamWPiece {
  float* param = nullptr;
  const float* grad = nullptr;
  int64_t count = 0;
  int64_t state_offset = 0;
  bool decay = true;
};

class ShardedAdamW {
 public:
  // The moments are allocated on `ops` (which must outlive this) and zeroed.
  ShardedAdamW(kernels::Ops& ops, int64_t state_size, const spec::TrainSpec& train);

  // One update of every piece with this learning rate; advances step() first
  // (bias correction counts from 1, as AdamW).
  void Step(const std::vector<AdamWPiece>& pieces, double lr);

  int64_t step() const { return step_; }
  void set_step(int64_t step) { step_ = step; }
  int64_t state_size() const { return state_size_; }
  // Backend memory (null for an empty shard).
  float* exp_avg() { return m_.f32(); }
  float* exp_avg_sq() { return v_.f32(); }

 private:
  kernels::Ops& ops_;
  int64_t state_size_;
  kernels::Buffer m_, v_;
  spec::TrainSpec train_;
  int64_t step_ = 0;
};

}  // namespace loom::engine
