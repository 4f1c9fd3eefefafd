// A step's mixture-of-experts statistics (docs/moe.md, docs/metrics.md): the
// routing counts of every micro-batch and MoE layer, summed over the
// data-parallel group, the selection-bias update they drive, and the summary
// the step report carries (tokens per expert, imbalance, drops, aux loss).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
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

// The selection biases of the model's MoE layers as checkpoint state
// (metadata.json's "state"."moe_bias": {name: [E floats]}), so a resumed run
// selects as the uninterrupted one; and back. Restoring checks every name
// and length the model has and names the first that differs.
nlohmann::json ExpertBiasesToJson(LlamaModel& model);
absl::Status RestoreExpertBiases(const nlohmann::json& biases, LlamaModel& model);

}  // namespace loom::engine
