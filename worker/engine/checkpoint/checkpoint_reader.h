// Opening one committed checkpoint step and verifying it before anything is
// copied out: metadata present and well formed, every listed file present
// with the recorded size and CRC-32, every safetensors header valid, and every
// index entry consistent with the file that holds it. Any fault is an error
// naming the file and the fault.
//
// Two ways to open (CheckpointReadMode): kAllFiles reads and CRC-checks every
// file at open (export, tools, tests); kOnDemand checks at open what is cheap
// (metadata.json, index.json with its CRC, every file's size and safetensors
// header, the shards' tiling) and reads a data file, checking its CRC-32,
// only the first time a copy needs one of its shards, so a rank of a sharded
// layout reads only the files its pieces overlap. A file's fault then
// surfaces from Fetch/CopyTo with the same error as from a full open.
#pragma once

#include <cstdint>
#include <map>
#include <set>
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

enum class CheckpointReadMode { kAllFiles, kOnDemand };

// Not thread-safe: the const copies read files on demand into a cache.
class CheckpointReader {
 public:
  static absl::StatusOr<CheckpointReader> Open(
      const std::string& step_dir, CheckpointReadMode mode = CheckpointReadMode::kAllFiles);

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

  // Reads (and CRC-checks) the files holding shards that overlap dst, the
  // first time each is needed; a copy does this itself, a loader calls it
  // for every target first so that a refused step leaves them untouched.
  absl::Status Fetch(const FlatSlice& dst) const;
  absl::Status Fetch(const CheckpointRect& dst) const;
  // Reads and CRC-checks every file not read yet without keeping its data
  // (one file in memory at a time): the whole step is intact.
  absl::Status VerifyAllFiles() const;
  // The data files read so far (each listed once), in the order read.
  const std::vector<std::string>& files_read() const { return files_read_; }
  size_t file_count() const { return files_.size(); }

 private:
  static absl::StatusOr<CheckpointReader> OpenUnchecked(const std::string& step_dir,
                                                        CheckpointReadMode mode);
  // The file's data, read and verified on first use.
  absl::StatusOr<const SafetensorsFile*> Load(const std::string& file) const;
  // Fetch for one tensor's shards that `overlaps` accepts.
  template <typename Overlaps>
  absl::Status FetchShards(const std::string& name, Overlaps overlaps) const;

  std::string dir_;
  int64_t step_ = 0;
  spec::ModelSpec model_;
  nlohmann::json state_;
  std::vector<CheckpointTensorInfo> tensors_;
  std::map<std::string, size_t> by_name_;
  // Every listed file: whole once loaded, its header only before.
  mutable std::map<std::string, SafetensorsFile> files_;
  mutable std::set<std::string> loaded_;
  mutable std::set<std::string> verified_;  // by VerifyAllFiles, data dropped
  mutable std::vector<std::string> files_read_;
  std::map<std::string, nlohmann::json> entries_;  // metadata.json's size and CRC
};

}  // namespace loom::engine
