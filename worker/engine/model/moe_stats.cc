#include "worker/engine/model/moe_stats.h"

#include <algorithm>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"

#include "worker/engine/model/host_floats.h"
#include "worker/engine/model/llama_model.h"

namespace loom::engine {

MoeSummary SummarizeMoe(const MoeStepStats& stats, int64_t num_experts, int64_t micro_batches) {
  MoeSummary s;
  if (num_experts <= 0) return s;
  const size_t e_count = static_cast<size_t>(num_experts);
  const size_t layers = stats.tokens_per_expert.size() / e_count;
  s.tokens_per_expert.assign(e_count, 0.0);
  s.tokens_min = layers > 0 ? std::numeric_limits<double>::infinity() : 0.0;
  for (size_t l = 0; l < layers; ++l) {
    const double* load = stats.tokens_per_expert.data() + l * e_count;
    double sum = 0, most = 0;
    for (size_t e = 0; e < e_count; ++e) {
      s.tokens_per_expert[e] += load[e];
      s.tokens_min = std::min(s.tokens_min, load[e]);
      most = std::max(most, load[e]);
      sum += load[e];
    }
    s.tokens_max = std::max(s.tokens_max, most);
    const double mean = sum / static_cast<double>(e_count);
    if (mean > 0) s.imbalance = std::max(s.imbalance, most / mean);
  }
  s.dropped_fraction = stats.assignments > 0 ? stats.dropped / stats.assignments : 0.0;
  s.aux_loss = micro_batches > 0 ? stats.aux_loss / static_cast<double>(micro_batches) : 0.0;
  return s;
}

absl::StatusOr<MoeSummary> FinishMoeStep(LlamaModel& model, comm::Communicator* dp,
                                         int64_t micro_batches) {
  MoeStepStats stats = model.TakeMoeStats();
  const int64_t e_count = model.config().moe.num_experts;
  if (dp != nullptr && dp->size() > 1) {
    // One float all-reduce: the loads, then drops, assignments and aux loss
    // (counts stay exact in float up to 2^24 per entry).
    std::vector<float> packed(stats.tokens_per_expert.begin(), stats.tokens_per_expert.end());
    packed.push_back(static_cast<float>(stats.dropped));
    packed.push_back(static_cast<float>(stats.assignments));
    packed.push_back(static_cast<float>(stats.aux_loss));
    if (absl::Status s = AllReduceHostFloats(model.ops(), dp, packed.data(),
                                             static_cast<int64_t>(packed.size()));
        !s.ok()) {
      return s;
    }
    const size_t n = stats.tokens_per_expert.size();
    for (size_t i = 0; i < n; ++i) stats.tokens_per_expert[i] = packed[i];
    stats.dropped = packed[n];
    stats.assignments = packed[n + 1];
    stats.aux_loss = packed[n + 2];
  }
  model.UpdateExpertBias(stats.tokens_per_expert);
  return SummarizeMoe(stats, e_count, micro_batches);
}

nlohmann::json ExpertBiasesToJson(LlamaModel& model) {
  nlohmann::json out = nlohmann::json::object();
  for (const TensorView& b : model.ExpertBiases()) {
    out[b.name] = std::vector<float>(b.data, b.data + b.numel());
  }
  return out;
}

absl::Status RestoreExpertBiases(const nlohmann::json& biases, LlamaModel& model) {
  for (const TensorView& b : model.ExpertBiases()) {
    if (!biases.is_object() || !biases.contains(b.name) || !biases[b.name].is_array() ||
        static_cast<int64_t>(biases[b.name].size()) != b.numel()) {
      return absl::DataLossError(absl::StrCat("checkpoint state moe_bias: ", b.name,
                                              " is missing or does not hold ", b.numel(),
                                              " numbers"));
    }
    for (int64_t e = 0; e < b.numel(); ++e) {
      const nlohmann::json& v = biases[b.name][static_cast<size_t>(e)];
      if (!v.is_number()) {
        return absl::DataLossError(absl::StrCat("checkpoint state moe_bias: ", b.name, "[", e,
                                                "] is not a number"));
      }
      b.data[e] = v.get<float>();
    }
  }
  return absl::OkStatus();
}

}  // namespace loom::engine
