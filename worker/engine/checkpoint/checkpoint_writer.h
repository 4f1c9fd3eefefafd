// Writing and committing one checkpoint step. The step becomes visible only
// through an atomic rename of a fully written and fsynced temporary directory,
// so a reader never sees a torn step; older steps beyond `keep` are removed
// only after the new one is committed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "nlohmann/json.hpp"
#include "worker/engine/checkpoint/durable_file.h"
#include "worker/engine/tensor_view.h"

namespace loom::engine {

// Where a stored tensor sits in a global tensor when it is a shard: the slice
// at `offset` (per dimension) of `global_shape`, with the stored tensor's shape.
struct CheckpointSlice {
  std::string tensor;  // global name
  std::vector<int64_t> global_shape;
  std::vector<int64_t> offset;
};

// One safetensors file of the step. group ("model", "optimizer") lets export
// and loaders select tensors. Without slices every tensor is whole and its
// name is global (unique across files); with slices (one per tensor) each
// tensor is the named piece of a global tensor and its name is only its key
// in this file.
struct CheckpointFile {
  std::string name;
  std::string group;
  std::vector<TensorView> tensors;
  std::vector<CheckpointSlice> slices;
};

struct CheckpointContent {
  int64_t step = 0;
  spec::ModelSpec model;
  std::vector<CheckpointFile> files;
  // Whatever the training loop needs to resume (data position, RNG, tokens).
  nlohmann::json state = nlohmann::json::object();
};

// A step written by its writers (the ranks of a layout, each its own
// pieces): one coordinating writer calls BeginCheckpointStep and, once every
// writer has written its files with WriteCheckpointFile into the same
// temporary directory, CommitCheckpointStep with every file's digest, which
// replaces an existing step of that number and then deletes all but the
// newest `keep` committed steps (keep <= 0 keeps all) and stale temporary
// directories. `tag` names the temporary directory (the coordinator's pid),
// so every writer can derive it.
std::string CheckpointTempDir(const std::string& root, int64_t step, int64_t tag);
absl::StatusOr<std::string> BeginCheckpointStep(const std::string& root, int64_t step,
                                                int64_t tag);
absl::StatusOr<FileDigest> WriteCheckpointFile(const std::string& temp_dir,
                                               const CheckpointFile& file);
// content.files describe every file of the step (for the index; their data
// is not read), digests[i] is files[i]'s. Writes the index and the metadata,
// renames the directory into place and prunes to `keep`.
absl::StatusOr<std::string> CommitCheckpointStep(const std::string& root,
                                                 const std::string& temp_dir,
                                                 const CheckpointContent& content,
                                                 const std::vector<FileDigest>& digests,
                                                 int64_t keep);

// One file as its writer describes it to the committing writer (name, group,
// every tensor's key and shape, every slice; no data), and back. The reading
// throws nlohmann::json::exception on a malformed description (the caller
// names the file it came from).
nlohmann::json DescribeCheckpointFile(const CheckpointFile& file);
CheckpointFile CheckpointFileFromDescription(const nlohmann::json& description);

// A file's digest as integers, so writers can hand it to the committing rank
// through an all-gather of integers (AllGatherHostInts, parallel/host_floats.h):
// slot[0] = 1 marks it present (an unwritten slot stays 0), then the byte
// count's low and high 32 bits and the CRC.
inline constexpr int kDigestInts = 4;
void EncodeFileDigest(const FileDigest& digest, int32_t* slot);
FileDigest DecodeFileDigest(const int32_t* slot);

}  // namespace loom::engine
