// A step's mixture-of-experts statistics (docs/moe.md, docs/metrics.md): the
// routing counts of every micro-batch and MoE layer, summed over the
// data-parallel group, the selection-bias update they drive, and the summary
// the step report carries (tokens per expert, imbalance, drops, aux loss).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/comm/communicator.h"
#include "worker/engine/model/moe_layer.h"
#include "worker/engine/model/moe_summary.h"

namespace loom::engine {

class LlamaModel;


// Pure: the summary of `stats` (already summed over DP) for E experts and
// the step's micro-batches (all DP ranks).
MoeSummary SummarizeMoe(const MoeStepStats& stats, int64_t num_experts, int64_t micro_batches);

// After a step's micro-batches: takes the model's statistics, sums them over
// `dp` (null: one rank), moves the selection biases (when the spec's rate is
// set) and returns the summary. Collective over dp.
absl::StatusOr<MoeSummary> FinishMoeStep(LlamaModel& model, comm::Communicator* dp,
                                         int64_t micro_batches);
// [ep] The same, summed over each of `groups` in turn (dp, then ep: every
// rank that reads other data; null entries skipped).
absl::StatusOr<MoeSummary> FinishMoeStep(LlamaModel& model,
                                         const std::vector<comm::Communicator*>& groups,
                                         int64_t micro_batches);

// [pp] A pipeline stage's chunks: each chunk's statistics summed over
// `groups` and its biases moved, then the whole model's summary assembled over
// `pp` (every stage fills its MoE layers of one table). Collective over the
// groups and pp.
absl::StatusOr<MoeSummary> FinishPipelineMoeStep(const std::vector<LlamaModel*>& chunks,
                                                 const std::vector<comm::Communicator*>& groups,
                                                 comm::Communicator* pp, int64_t micro_batches);

}  // namespace loom::engine
