// A named view of an fp32 tensor owned elsewhere (a model parameter, its
// gradient, an optimizer state). Checkpoints, export and the optimizer work on
// lists of these, so they need not know the model.
//
// Under tensor parallelism a view holds this rank's SHARD: `shape` is the
// local shape, and the sharding fields say where it sits in the global tensor
// (so checkpoints and export can assemble global tensors, and norms can count
// every global element once). The defaults mean "not sharded".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::engine {

struct TensorView {
  std::string name;            // Hugging Face Llama name, e.g. model.layers.0.mlp.up_proj.weight
  std::vector<int64_t> shape;  // row-major, Hugging Face shape ([out, in] for linear weights)
  float* data = nullptr;

  // The global tensor's shape; empty means the same as `shape`.
  std::vector<int64_t> global_shape = {};
  // This view is global[..., shard_offset : shard_offset + shape[shard_axis], ...]
  // along shard_axis (all other axes whole); -1: the view is the whole tensor.
  int shard_axis = -1;
  int64_t shard_offset = 0;
  // How many ranks of the tensor-parallel group hold this same slice (with
  // identical values): the norm weights are held by all of them, kv heads that
  // the TP size does not divide by the ranks whose query heads read them.
  // A sum over the group of (local sum of squares / replicas) counts each
  // global element once.
  int replicas = 1;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  bool sharded() const { return shard_axis >= 0; }
  const std::vector<int64_t>& GlobalShape() const {
    return global_shape.empty() ? shape : global_shape;
  }
};

}  // namespace loom::engine
