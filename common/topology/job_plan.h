// The one derivation of a job's pipeline plan from its spec and layout: the
// stage partition (default FLOP end costs) and every stage's instruction list.
// The coordinator builds each rank's assignment from it and the trainer runs
// its stage from it (worker/engine/pipeline_parallel/pipeline_plan.h), so the
// two can never disagree. Placement is separate (placement.h): it depends on
// the nodes, not on the spec. Pure logic, no I/O.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "common/spec/layout.h"
#include "common/topology/instruction.h"
#include "common/topology/schedule.h"
#include "common/topology/stage_partition.h"

namespace loom::topology {

struct JobPlan {
  spec::Layout layout;
  int64_t num_layers = 0;  // the model's
  // Empty without a pipeline (layout.pp == 1): one stage holds every layer
  // and runs no instruction list.
  StagePartition partition;
  PipelineSchedule schedule;
  double bubble_fraction = 0;  // analytic, uniform chunk costs

  bool pipelined() const { return layout.pp > 1; }
  // Stage `stage`'s chunks in chunk order (pipelined plans only).
  std::vector<ModelChunk> ChunksOf(int64_t stage) const { return partition.ChunksOfStage(stage); }
  // The layers stage `stage` holds, ascending (every layer without a pipeline).
  std::vector<int64_t> LayersOf(int64_t stage) const;
  // Stage `stage`'s instruction list (empty without a pipeline).
  std::vector<Instruction> InstructionsOf(int64_t stage) const;
};

// The plan of `spec` under `layout` (usually spec::LayoutOf(spec); the trainer
// passes the pp and micro-batches of its context). Micro-batches per step on
// each data shard are layout.grad_accum. INVALID_ARGUMENT, naming the field,
// for what the partition or schedule refuses: fewer layers than pp *
// virtual_stages, virtual_stages > 1 without the interleaved schedule,
// interleaved with micro-batches not a multiple of pp.
absl::StatusOr<JobPlan> DeriveJobPlan(const spec::JobSpec& spec, const spec::Layout& layout);
absl::StatusOr<JobPlan> DeriveJobPlan(const spec::JobSpec& spec);

}  // namespace loom::topology
