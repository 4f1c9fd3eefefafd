// Checkpoints of a ZeRO layout (stage >= 1, DP > 1): every rank writes its own
// shard files into the step's temporary directory and DP rank 0 commits the
// step with one index of global shapes, so a step saved under one ZeRO stage
// and DP size loads under any other (and into the unsharded engine):
//   model-tp00-pp00.safetensors              stages 1, 2: rank 0, whole tensors
//   model-tp00-pp00-dpRR.safetensors         stage 3: rank RR's parameter shard
//   optimizer-tp00-pp00-dpRR.safetensors     rank RR's exp_avg / exp_avg_sq shard
// A shard's flat range of a tensor is stored as rectangular slices (keys
// "<tensor>@<offset>"), each listed in the index with its offset and shape.
//
// On a device backend the shards are copied down into host buffers before
// they are written, and loaded into host buffers that go up only once the
// whole step has loaded (RestoreStaging); the small control values (the
// directory's pid, digests, the commit flag) cross the group through backend
// buffers (model/host_floats.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/comm/communicator.h"
#include "worker/engine/checkpoint/checkpoint_reader.h"
#include "worker/engine/checkpoint/checkpoint_writer.h"
#include "worker/engine/model/llama_model.h"
#include "worker/engine/data_parallel/dp_engine.h"

namespace loom::engine {

// Collective over comm (the engine's DP group). `content` carries step, model
// and loop state; its files are ignored. Returns the committed directory on
// rank 0 and "" elsewhere.
absl::StatusOr<std::string> SaveShardedCheckpoint(const std::string& root,
                                                  const CheckpointContent& content,
                                                  LlamaModel& model, DataParallelEngine& engine,
                                                  comm::Communicator& comm, int64_t keep);

// What this rank loads: whole parameters (stages 1, 2) or its parameter shard
// (stage 3), and its shard of the moments. Backend memory: load through
// RestoreStaging.
std::vector<FlatSlice> ShardedRestoreTargets(LlamaModel& model, DataParallelEngine& engine);

// Host buffers for load targets in backend memory (the targets themselves on
// a host backend): the loader fills host(), Upload copies them into the
// backend's targets, which must stay valid until then.
class RestoreStaging {
 public:
  RestoreStaging(kernels::Ops& ops, std::vector<FlatSlice> targets);
  RestoreStaging(const RestoreStaging&) = delete;
  RestoreStaging& operator=(const RestoreStaging&) = delete;

  const std::vector<FlatSlice>& host() const { return host_; }
  void Upload();

 private:
  kernels::Ops& ops_;
  std::vector<FlatSlice> device_;
  std::vector<FlatSlice> host_;
  std::vector<std::vector<float>> storage_;
};

}  // namespace loom::engine
