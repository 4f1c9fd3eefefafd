// The on-disk layout of a Loom checkpoint, shared by the writer, the reader
// and export:
//   <root>/step_00000010/            one committed step (atomic rename from a
//     model-r00000.safetensors         temporary sibling ".step_00000010.tmp-<pid>")
//     optimizer-r00000.safetensors     (one pair per rank that holds a unique
//     ...                              piece: its shards, "<tensor>@<offset>")
//     index.json                     global tensor names, dtypes, shapes, groups
//                                    and the shards (file, key, offset, shape)
//                                    that tile each
//     metadata.json                  written last: step, model config, loop
//                                    state, every file's size and CRC-32
// File names are a convention; readers go through index.json, so every
// layout (one process, TP, PP, ZeRO, any mix) writes the same format and any
// layout reads it (checkpoint/distributed_save.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "nlohmann/json.hpp"

namespace loom::engine {

inline constexpr char kCheckpointMetadataFile[] = "metadata.json";
inline constexpr char kCheckpointIndexFile[] = "index.json";
inline constexpr char kCheckpointFormat[] = "loom-checkpoint";
// Version 2: every tensor stored as shards with their place in the global
// tensor, written by the ranks that hold them. Version 1 (whole tensors or
// ZeRO's flat shards, under the same index format) still loads.
inline constexpr int kCheckpointVersion = 2;
inline constexpr int kOldestReadableCheckpointVersion = 1;

std::string StepDirName(int64_t step);  // "step_00000010"
std::optional<int64_t> ParseStepDirName(std::string_view name);

// Step directories under root (committed or not), newest first.
std::vector<std::pair<int64_t, std::string>> ListStepDirs(const std::string& root);
// The newest step directory under root that has its metadata.json (a commit
// marker only; its contents are verified when opened).
std::optional<std::string> NewestCommittedStepDir(const std::string& root);
// A step directory as is, or a checkpoint root resolved to its newest
// committed step.
absl::StatusOr<std::string> ResolveStepDir(const std::string& path);

nlohmann::json ModelSpecToJson(const spec::ModelSpec& model);
absl::StatusOr<spec::ModelSpec> ModelSpecFromJson(const nlohmann::json& j,
                                                  const std::string& source);
// FAILED_PRECONDITION naming the first field whose value changes a tensor shape.
absl::Status CheckSameModelShape(const spec::ModelSpec& job, const spec::ModelSpec& checkpoint,
                                 const std::string& source);

}  // namespace loom::engine
