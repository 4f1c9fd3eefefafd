// How the data-parallel engine cuts the model's flat parameter array (and the
// gradient array of the same layout): into units (the model's hook units:
// embedding, each decoder layer, the head), into buckets (the granularity of
// every gradient reduction and parameter gather), and into each rank's shard
// of every bucket (ZeRO). Pure logic, no communication.
//
// Buckets hold whole tensors, about `bucket_floats` each (a larger tensor gets
// a bucket of its own), and are built from the END of the array, because
// backward completes the head first and the embedding last: buckets are
// listed in launch order, and bucket b is complete once the unit holding its
// first element has its gradients (ready_unit). With split_at_units (ZeRO-2/3)
// no bucket crosses a unit, so a unit is gathered and freed as whole buckets.
//
// Sharding: bucket b of `size` floats is padded to ranks * chunk (chunk =
// ceil(size / ranks)); rank r owns elements [begin + r*chunk, begin + (r+1)*chunk)
// clipped to the bucket. A rank's shard is its chunks of every bucket, in
// launch order, each a full chunk long (padding included), so reduce-scatter
// and all-gather work on equal pieces.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace loom::engine {

struct FlatTensor {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;  // into the flat array, in floats
  int64_t numel = 0;
  int64_t unit = 0;
};

struct FlatBucket {
  int64_t begin = 0, end = 0;  // flat range of whole tensors
  int64_t chunk = 0;           // each rank's share (the padded size is ranks * chunk)
  int64_t shard_offset = 0;    // where every rank's chunk of it sits in that rank's shard
  int64_t ready_unit = 0;      // the unit holding `begin`
  int64_t size() const { return end - begin; }
};

// A run of one rank's owned elements inside one tensor: what the sharded
// optimizer updates (with the tensor's weight decay) and what sharded
// checkpoints store.
struct OwnedPiece {
  int64_t tensor = 0;        // index into tensors()
  int64_t flat_begin = 0;    // in the flat array
  int64_t count = 0;
  int64_t shard_offset = 0;  // in the rank's shard
};

struct PartitionOptions {
  int ranks = 1;
  int64_t bucket_floats = 1 << 20;
  bool split_at_units = false;
};

class FlatPartition {
 public:
  // tensors: in flat order, contiguous from 0, with non-decreasing units
  // below num_units.
  static absl::StatusOr<FlatPartition> Build(std::vector<FlatTensor> tensors, int64_t num_units,
                                             const PartitionOptions& options);

  const std::vector<FlatTensor>& tensors() const { return tensors_; }
  const std::vector<FlatBucket>& buckets() const { return buckets_; }  // launch order
  int ranks() const { return ranks_; }
  int64_t total() const { return total_; }
  int64_t num_units() const { return static_cast<int64_t>(ready_.size()); }
  // Buckets that the unit's gradients complete, in launch order.
  const std::vector<int>& BucketsReadyAt(int64_t unit) const { return ready_[unit]; }
  // Buckets lying inside the unit (all of them with split_at_units).
  const std::vector<int>& BucketsInUnit(int64_t unit) const { return inside_[unit]; }
  // Floats in each rank's shard (sum of chunks).
  int64_t shard_size() const { return shard_size_; }
  int64_t OwnedBegin(const FlatBucket& b, int rank) const;
  int64_t OwnedEnd(const FlatBucket& b, int rank) const;
  // The rank's owned elements split at tensor boundaries, in shard order.
  std::vector<OwnedPiece> OwnedPieces(int rank) const;

 private:
  std::vector<FlatTensor> tensors_;
  std::vector<FlatBucket> buckets_;
  std::vector<std::vector<int>> ready_, inside_;
  int ranks_ = 1;
  int64_t total_ = 0;
  int64_t shard_size_ = 0;
};

// The hook unit of a Hugging Face Llama parameter name: 0 for
// model.embed_tokens, 1 + l for model.layers.<l>.*, num_layers + 1 otherwise
// (model.norm, lm_head).
int64_t UnitOfParameter(const std::string& name, int64_t num_layers);

// Cuts elements [begin, begin + count) of a row-major tensor into the fewest
// rectangular slices in order, each contiguous in memory (a partial row, full
// rows, a partial row, recursively for more dimensions): how a flat shard is
// described as offsets and shapes of the global tensor.
struct RectSlice {
  std::vector<int64_t> offset;
  std::vector<int64_t> shape;
  int64_t flat_begin = 0;  // of the slice's first element in the tensor
  int64_t numel() const;
};
std::vector<RectSlice> FlatRangeToSlices(const std::vector<int64_t>& shape, int64_t begin,
                                         int64_t count);
// The same cut of a local tensor of `shape` that is the slice at
// shard_offset along shard_axis of a global tensor (-1: the whole tensor),
// with the offsets moved into the global tensor: a checkpoint's slices of
// one piece of state.
std::vector<RectSlice> ShardRangeToGlobalSlices(const std::vector<int64_t>& shape, int shard_axis,
                                                int64_t shard_offset, int64_t begin,
                                                int64_t count);

}  // namespace loom::engine
