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

// After a step's micro-batches, for the model parts this rank trains (a
// pipeline stage's chunks; without a pipeline one chunk, the whole model):
// each part's statistics summed over each of `groups` in turn (dp, then ep:
// every rank that reads other data; null entries skipped) and its selection
// biases moved (when the spec's rate is set), then the whole model's summary
// assembled over `pp` (each stage fills its MoE layers of one table; null:
// one stage). Collective over the groups and pp.
absl::StatusOr<MoeSummary> FinishMoeStep(const std::vector<LlamaModel*>& parts,
                                         const std::vector<comm::Communicator*>& groups,
                                         comm::Communicator* pp, int64_t micro_batches);

// The selection biases of the MoE layers as checkpoint state
// (metadata.json's "state"."moe_bias": {name: [E floats]}), so a resumed run
// selects as the uninterrupted one; and back. `parts`: the model parts this
// rank trains (a stage's chunks); under a pipeline each stage holds its own
// layers' biases, so saving gathers the whole model's over `pp` (collective
// over pp; null: one stage). Restoring sets each part's own layers and
// names the first that is missing or of another length.
absl::StatusOr<nlohmann::json> ExpertBiasesToJson(const std::vector<LlamaModel*>& parts,
                                                  comm::Communicator* pp);
absl::Status RestoreExpertBiases(const nlohmann::json& biases,
                                 const std::vector<LlamaModel*>& parts);

}  // namespace loom::engine
