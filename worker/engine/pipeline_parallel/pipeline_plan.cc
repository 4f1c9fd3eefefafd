#include "worker/engine/pipeline_parallel/pipeline_plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/spec/layout.h"
#include "common/topology/job_plan.h"

namespace loom::engine {
absl::StatusOr<PipelinePlan> MakePipelinePlan(const spec::JobSpec& spec, int64_t stage, int64_t pp,
                                              int64_t microbatches) {
  if (pp < 1 || stage < 0 || stage >= pp) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline stage ", stage, " of parallelism.pp=", pp, " does not exist"));
  }
  if (pp == 1) {
    // The degenerate pipeline: one stage of one chunk, the whole model (the
    // training loop's parts when there is no pp group), each micro-batch's
    // forward and backward in turn (the executor runs them as one fused pass
    // on a chunk with the head), then the reduction and the step.
    PipelinePlan plan;
    plan.microbatches = microbatches;
    plan.chunks.push_back({0, 0, 0, spec.model.num_layers, true, true});
    for (int64_t mb = 0; mb < microbatches; ++mb) {
      plan.instructions.push_back(topology::Instruction::Forward(mb, 0));
      plan.instructions.push_back(topology::Instruction::Backward(mb, 0));
    }
    plan.instructions.push_back(topology::Instruction::ReduceGradients());
    plan.instructions.push_back(topology::Instruction::OptimizerStep());
    return plan;
  }
  spec::Layout layout = spec::LayoutOf(spec);
  layout.pp = pp;
  layout.grad_accum = microbatches;
  absl::StatusOr<topology::JobPlan> job = topology::DeriveJobPlan(spec, layout);
  if (!job.ok()) return job.status();
  if (!job->pipelined()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a pipeline plan needs parallelism.pp > 1, not ", pp));
  }
  PipelinePlan plan;
  plan.pp = pp;
  plan.stage = stage;
  plan.virtual_stages = spec.parallelism.virtual_stages;
  plan.microbatches = microbatches;
  for (const topology::ModelChunk& c : job->ChunksOf(stage)) {
    plan.chunks.push_back({c.chunk, c.virtual_stage, c.first_layer, c.num_layers, c.has_embedding,
                           c.has_lm_head});
  }
  plan.instructions = job->InstructionsOf(stage);
  return plan;
}

std::vector<int64_t> StageLayers(const PipelinePlan& plan) {
  std::vector<int64_t> layers;
  for (const PipelineChunk& c : plan.chunks) {
    for (int64_t l = 0; l < c.num_layers; ++l) layers.push_back(c.first_layer + l);
  }
  std::sort(layers.begin(), layers.end());
  return layers;
}

}  // namespace loom::engine
