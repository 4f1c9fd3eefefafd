// Opening one committed checkpoint step and verifying it before anything is
// copied out: metadata present and well formed, every listed file present
// with the recorded size and CRC-32, every safetensors header valid, and every
// index entry consistent with the file that holds it. Any fault is an error
// naming the file and the fault.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "nlohmann/json.hpp"
#include "worker/engine/checkpoint/safetensors.h"
#include "worker/engine/tensor_view.h"

namespace loom::engine {

// One stored piece of a tensor: the rectangular slice at `offset` (per
// dimension) of shape `shape`, stored as `key` in `file`.
struct CheckpointShardInfo {
  std::string file;
  std::string key;
  std::vector<int64_t> offset;
  std::vector<int64_t> shape;
};

struct CheckpointTensorInfo {
  std::string name;
  std::string group;
  std::vector<int64_t> shape;  // global shape
  std::string file;            // the first shard's file and key (the only
  std::string key;             // ones for an unsharded tensor)
  // Pieces that tile the global tensor exactly (checked when opening).
  std::vector<CheckpointShardInfo> shards;
};

// Elements [begin, begin + count) of the row-major global tensor `name` of
// global shape `shape`: what one rank of a sharded layout (ZeRO's flat
// shards) loads; a whole tensor is begin 0, count = numel.
struct FlatSlice {
  std::string name;
  std::vector<int64_t> shape;
  int64_t begin = 0;
  int64_t count = 0;
  float* data = nullptr;
};

// The rectangular slice at `offset` (per dimension) of shape `shape` of the
// global tensor `name` of shape `global_shape`, row-major at data: what a
// rank of any layout loads (a TP shard, or a rectangle of a ZeRO flat range
// within it).
struct CheckpointRect {
  std::string name;
  std::vector<int64_t> global_shape;
  std::vector<int64_t> offset;
  std::vector<int64_t> shape;
  float* data = nullptr;
};

class CheckpointReader {
 public:
  static absl::StatusOr<CheckpointReader> Open(const std::string& step_dir);

  const std::string& dir() const { return dir_; }
  int64_t step() const { return step_; }
  const spec::ModelSpec& model() const { return model_; }
  const nlohmann::json& state() const { return state_; }
  // Index order (sorted by name).
  const std::vector<CheckpointTensorInfo>& tensors() const { return tensors_; }
  const CheckpointTensorInfo* Find(const std::string& name) const;

  // Copies the named tensor (dst.name) into dst; the global shapes must match.
  absl::Status CopyTo(const TensorView& dst) const;
  // Copies a flat range of the named tensor, assembled from its shards; the
  // global shapes must match and the range must lie inside the tensor.
  absl::Status CopyTo(const FlatSlice& dst) const;
  // Copies a rectangular slice of the named tensor, assembled from whatever
  // shards the step holds (saved under any layout).
  absl::Status CopyTo(const CheckpointRect& dst) const;
  absl::StatusOr<std::vector<float>> Values(const std::string& name) const;

 private:
  static absl::StatusOr<CheckpointReader> OpenUnchecked(const std::string& step_dir);

  std::string dir_;
  int64_t step_ = 0;
  spec::ModelSpec model_;
  nlohmann::json state_;
  std::vector<CheckpointTensorInfo> tensors_;
  std::map<std::string, size_t> by_name_;
  std::map<std::string, SafetensorsFile> files_;
};

}  // namespace loom::engine
