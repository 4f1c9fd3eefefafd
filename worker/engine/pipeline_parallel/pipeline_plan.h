// What one pipeline stage runs: its model chunks (layers, embedding, head) and
// its instruction list for one optimizer step: the stage's view of the one
// derivation the coordinator uses too (topology::DeriveJobPlan,
// common/topology/job_plan.h). The trainer
// can therefore run a pipeline with nothing but the spec, its stage and the
// pp group; an assignment's `layers` are checked against the result.
// Pure logic, no I/O.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "common/topology/instruction.h"

namespace loom::engine {

struct PipelineChunk {
  int64_t chunk = 0;          // index among the stage's chunks
  int64_t virtual_stage = 0;  // chunk * pp + stage
  int64_t first_layer = 0;    // layers [first_layer, first_layer + num_layers)
  int64_t num_layers = 0;
  bool embedding = false;
  bool head = false;
};

struct PipelinePlan {
  int64_t pp = 1;
  int64_t stage = 0;
  int64_t virtual_stages = 1;
  int64_t microbatches = 1;             // per optimizer step on this data shard
  std::vector<PipelineChunk> chunks;     // this stage's, in chunk order
  std::vector<topology::Instruction> instructions;
};

// Stage `stage` of `pp` for parallelism.schedule / virtual_stages, with
// `microbatches` micro-batches per step. INVALID_ARGUMENT (naming the field)
// for what the partition or schedule refuses: fewer layers than pp *
// virtual_stages, virtual_stages > 1 without the interleaved schedule,
// interleaved with micro-batches not a multiple of pp. pp = 1: one stage of
// one chunk (the whole model): F, B per micro-batch, then RG, OS.
absl::StatusOr<PipelinePlan> MakePipelinePlan(const spec::JobSpec& spec, int64_t stage, int64_t pp,
                                              int64_t microbatches);

// The layers a stage holds, ascending (what RankAssignment.layers lists).
std::vector<int64_t> StageLayers(const PipelinePlan& plan);

}  // namespace loom::engine
