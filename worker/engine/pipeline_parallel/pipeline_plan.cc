#include "worker/engine/pipeline_parallel/pipeline_plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/topology/schedule.h"
#include "common/topology/stage_partition.h"

namespace loom::engine {
namespace {

topology::ScheduleKind KindOf(spec::Schedule s) {
  switch (s) {
    case spec::Schedule::kAfab:
      return topology::ScheduleKind::kAfab;
    case spec::Schedule::kInterleaved:
      return topology::ScheduleKind::kInterleaved;
    case spec::Schedule::k1F1B:
      break;
  }
  return topology::ScheduleKind::k1F1B;
}

}  // namespace

absl::StatusOr<PipelinePlan> MakePipelinePlan(const spec::JobSpec& spec, int64_t stage, int64_t pp,
                                              int64_t microbatches) {
  if (pp < 1 || stage < 0 || stage >= pp) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline stage ", stage, " of parallelism.pp=", pp, " does not exist"));
  }
  const spec::ModelSpec& m = spec.model;
  topology::PartitionRequest partition;
  partition.num_layers = m.num_layers;
  partition.pp = pp;
  partition.virtual_stages = spec.parallelism.virtual_stages;
  partition.dims = {m.hidden_size, m.ffn_hidden_size, m.vocab_size, spec.train.seq_len,
                    m.num_heads, m.num_kv_heads, m.tie_embeddings};
  absl::StatusOr<topology::StagePartition> parts = topology::PartitionLayers(partition);
  if (!parts.ok()) return parts.status();
  absl::StatusOr<topology::PipelineSchedule> schedule = topology::BuildSchedule(
      {KindOf(spec.parallelism.schedule), pp, spec.parallelism.virtual_stages, microbatches});
  if (!schedule.ok()) return schedule.status();
  PipelinePlan plan;
  plan.pp = pp;
  plan.stage = stage;
  plan.virtual_stages = spec.parallelism.virtual_stages;
  plan.microbatches = microbatches;
  for (const topology::ModelChunk& c : parts->ChunksOfStage(stage)) {
    plan.chunks.push_back({c.chunk, c.virtual_stage, c.first_layer, c.num_layers, c.has_embedding,
                           c.has_lm_head});
  }
  plan.instructions = schedule->stages[static_cast<size_t>(stage)];
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
