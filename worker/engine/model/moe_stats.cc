#include "worker/engine/model/moe_stats.h"

#include <algorithm>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"

#include "worker/engine/parallel/host_floats.h"
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

namespace {

// Sums `stats` over each of `groups` in turn (null entries skipped).
absl::Status SumOverGroups(kernels::Ops& ops, const std::vector<comm::Communicator*>& groups,
                           MoeStepStats* out) {
  MoeStepStats& stats = *out;
  for (comm::Communicator* dp : groups) {
    if (dp == nullptr || dp->size() <= 1) continue;
    // One float all-reduce: the loads, then drops, assignments and aux loss
    // (counts stay exact in float up to 2^24 per entry).
    std::vector<float> packed(stats.tokens_per_expert.begin(), stats.tokens_per_expert.end());
    packed.push_back(static_cast<float>(stats.dropped));
    packed.push_back(static_cast<float>(stats.assignments));
    packed.push_back(static_cast<float>(stats.aux_loss));
    if (absl::Status s = AllReduceHostFloats(ops, dp, packed.data(),
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
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<MoeSummary> FinishMoeStep(const std::vector<LlamaModel*>& parts,
                                         const std::vector<comm::Communicator*>& groups,
                                         comm::Communicator* pp, int64_t micro_batches) {
  if (parts.empty()) return MoeSummary{};
  const spec::ModelSpec& c = parts[0]->config();
  const int64_t e_count = c.moe.num_experts;
  const int64_t n = (c.num_layers - c.moe.first_dense_layers) * e_count;
  // The whole model's table, [MoE layer * E] then dropped, assignments and
  // aux loss: each stage fills its own layers, the sum over pp the rest
  // (kept in double on one stage, as the statistics are).
  std::vector<double> whole(static_cast<size_t>(n + 3), 0.0);
  for (LlamaModel* chunk : parts) {
    MoeStepStats stats = chunk->TakeMoeStats();
    if (absl::Status s = SumOverGroups(chunk->ops(), groups, &stats); !s.ok()) return s;
    chunk->UpdateExpertBias(stats.tokens_per_expert);
    const ModelPart& part = chunk->part();
    int64_t slot = 0;
    for (int64_t l = part.first_layer; l < part.first_layer + part.num_layers; ++l) {
      if (!c.IsMoeLayer(l)) continue;
      const int64_t at = (l - c.moe.first_dense_layers) * e_count;
      for (int64_t e = 0; e < e_count; ++e) {
        const size_t from = static_cast<size_t>(slot * e_count + e);
        if (from < stats.tokens_per_expert.size()) {
          whole[static_cast<size_t>(at + e)] = stats.tokens_per_expert[from];
        }
      }
      ++slot;
    }
    whole[static_cast<size_t>(n)] += stats.dropped;
    whole[static_cast<size_t>(n + 1)] += stats.assignments;
    whole[static_cast<size_t>(n + 2)] += stats.aux_loss;
  }
  if (pp != nullptr && pp->size() > 1) {
    std::vector<float> sum(whole.begin(), whole.end());
    if (absl::Status s = AllReduceHostFloats(parts[0]->ops(), pp, sum.data(), n + 3); !s.ok()) {
      return s;
    }
    whole.assign(sum.begin(), sum.end());
  }
  MoeStepStats all;
  all.tokens_per_expert.assign(whole.begin(), whole.begin() + n);
  all.dropped = whole[static_cast<size_t>(n)];
  all.assignments = whole[static_cast<size_t>(n + 1)];
  all.aux_loss = whole[static_cast<size_t>(n + 2)];
  return SummarizeMoe(all, e_count, micro_batches);
}

absl::StatusOr<nlohmann::json> ExpertBiasesToJson(const std::vector<LlamaModel*>& parts,
                                                  comm::Communicator* pp) {
  nlohmann::json out = nlohmann::json::object();
  for (LlamaModel* part : parts) {
    for (const TensorView& b : part->ExpertBiases()) {
      out[b.name] = std::vector<float>(b.data, b.data + b.numel());
    }
  }
  if (parts.empty() || pp == nullptr || pp->size() <= 1) return out;
  // [pp] Every stage's layers in one table [layer * E], zeros where another
  // stage holds the layer, summed over pp; the names follow the model's.
  const spec::ModelSpec& c = parts[0]->config();
  const int64_t e_count = c.moe.num_experts;
  const std::string kPrefix = "model.layers.", kSuffix = ".mlp.gate.e_score_correction_bias";
  std::vector<float> table(static_cast<size_t>(c.num_layers * e_count), 0.0f);
  for (auto it = out.begin(); it != out.end(); ++it) {
    const int64_t layer = std::stoll(it.key().substr(kPrefix.size()));
    const std::vector<float> values = it.value().get<std::vector<float>>();
    std::copy(values.begin(), values.end(), table.begin() + layer * e_count);
  }
  if (absl::Status s = AllReduceHostFloats(parts[0]->ops(), pp, table.data(),
                                           static_cast<int64_t>(table.size()));
      !s.ok()) {
    return s;
  }
  out = nlohmann::json::object();
  for (int64_t l = 0; l < c.num_layers; ++l) {
    if (!c.IsMoeLayer(l)) continue;
    out[absl::StrCat(kPrefix, l, kSuffix)] =
        std::vector<float>(table.begin() + l * e_count, table.begin() + (l + 1) * e_count);
  }
  return out;
}

absl::Status RestoreExpertBiases(const nlohmann::json& biases,
                                 const std::vector<LlamaModel*>& parts) {
  for (LlamaModel* part : parts) {
    for (const TensorView& b : part->ExpertBiases()) {
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
  }
  return absl::OkStatus();
}

}  // namespace loom::engine
