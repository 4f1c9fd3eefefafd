// Bounds on every number a checkpoint's files carry, checked before the
// reader or export uses it: a checkpoint is input like any other (it may be
// truncated, corrupt or crafted), and a bad one must be an error naming the
// file and the field, never a division by zero, an overflowing size or an
// allocation the file cannot back. The reader (checkpoint_reader.cc,
// safetensors.cc) and export (export/hf_export.cc) call these.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"

namespace loom::engine {

// No tensor in a checkpoint may have more elements than this (2^40, 4 TiB
// of F32): far above any real shard, far below where sizes overflow.
inline constexpr int64_t kMaxCheckpointElements = int64_t{1} << 40;

// metadata.json is read whole before anything in it is checked: at most this
// many bytes (it lists one entry per file; 16,384 ranks' files take a few MiB).
inline constexpr int64_t kMaxCheckpointMetadataBytes = int64_t{256} << 20;

// The element count of shape: every dimension >= 0 and the product at most
// kMaxCheckpointElements, computed without overflow. DATA_LOSS naming `what`.
absl::StatusOr<int64_t> CheckedElementCount(const std::vector<int64_t>& shape,
                                            const std::string& what);

// The model fields of a checkpoint obey the job spec's model rules (the same
// rules a submitted job obeys: positive sizes, heads that divide hidden_size,
// kv heads that divide heads, ...). DATA_LOSS naming source and the field.
absl::Status CheckCheckpointModel(const spec::ModelSpec& model, const std::string& source);

// offset + size <= limit for non-negative values, without overflow.
bool FitsWithin(int64_t offset, int64_t size, int64_t limit);

}  // namespace loom::engine
