#include "common/topology/job_plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace loom::topology {

std::vector<int64_t> JobPlan::LayersOf(int64_t stage) const {
  std::vector<int64_t> layers;
  if (!pipelined()) {
    for (int64_t l = 0; l < num_layers; ++l) layers.push_back(l);
    return layers;
  }
  for (const ModelChunk& c : partition.ChunksOfStage(stage)) {
    for (int64_t l = 0; l < c.num_layers; ++l) layers.push_back(c.first_layer + l);
  }
  std::sort(layers.begin(), layers.end());
  return layers;
}

std::vector<Instruction> JobPlan::InstructionsOf(int64_t stage) const {
  if (!pipelined() || stage < 0 || stage >= static_cast<int64_t>(schedule.stages.size())) {
    return {};
  }
  return schedule.stages[static_cast<size_t>(stage)];
}

absl::StatusOr<JobPlan> DeriveJobPlan(const spec::JobSpec& spec, const spec::Layout& layout) {
  JobPlan plan;
  plan.layout = layout;
  plan.num_layers = spec.model.num_layers;
  if (layout.pp <= 1) return plan;
  const spec::ModelSpec& m = spec.model;
  PartitionRequest partition;
  partition.num_layers = m.num_layers;
  partition.pp = layout.pp;
  partition.virtual_stages = layout.virtual_stages;
  partition.dims = {m.hidden_size, m.ffn_hidden_size, m.vocab_size, spec.train.seq_len,
                    m.num_heads, m.num_kv_heads, m.tie_embeddings};
  absl::StatusOr<StagePartition> parts = PartitionLayers(partition);
  if (!parts.ok()) return parts.status();
  const ScheduleRequest request{layout.schedule, layout.pp, layout.virtual_stages,
                                layout.grad_accum};
  absl::StatusOr<PipelineSchedule> schedule = BuildSchedule(request);
  if (!schedule.ok()) return schedule.status();
  plan.partition = std::move(*parts);
  plan.schedule = std::move(*schedule);
  plan.bubble_fraction = AnalyticBubbleFraction(request);
  return plan;
}

absl::StatusOr<JobPlan> DeriveJobPlan(const spec::JobSpec& spec) {
  return DeriveJobPlan(spec, spec::LayoutOf(spec));
}

}  // namespace loom::topology
