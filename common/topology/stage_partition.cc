#include "common/topology/stage_partition.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace loom::topology {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// Costs are sums of a few hundred doubles; equal cuts must compare equal.
constexpr double kTolerance = 1e-9;

}  // namespace

absl::StatusOr<EndCosts> DefaultEndCosts(const ModelDims& dims, CostBasis basis) {
  if (dims.hidden_size <= 0 || dims.ffn_hidden_size <= 0 || dims.vocab_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot derive embedding/LM-head costs: dims.hidden_size=", dims.hidden_size,
        ", dims.ffn_hidden_size=", dims.ffn_hidden_size, ", dims.vocab_size=", dims.vocab_size,
        " must all be > 0 (or give end_costs)"));
  }
  if (basis == CostBasis::kFlops && dims.seq_len <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot derive FLOPs costs: dims.seq_len=",
                                                   dims.seq_len, " must be > 0"));
  }
  const double h = static_cast<double>(dims.hidden_size);
  const double f = static_cast<double>(dims.ffn_hidden_size);
  const double v = static_cast<double>(dims.vocab_size);
  double kv = h;
  if (dims.num_heads > 0 && dims.num_kv_heads > 0) {
    kv = h / static_cast<double>(dims.num_heads) * static_cast<double>(dims.num_kv_heads);
  }
  const double block_weights = 2 * h * h + 2 * h * kv + 3 * h * f;
  EndCosts out;
  if (basis == CostBasis::kFlops) {
    const double block = 2 * block_weights + 2 * static_cast<double>(dims.seq_len) * h;
    out.embedding = h / block;
    out.lm_head = 2 * h * v / block;
  } else {
    const double block = block_weights + 2 * h;  // two RMSNorm weights
    out.embedding = v * h / block;
    out.lm_head = dims.tie_embeddings ? 0.0 : v * h / block;
  }
  return out;
}

std::vector<ModelChunk> StagePartition::ChunksOfStage(int64_t stage) const {
  std::vector<ModelChunk> out;
  for (int64_t c = 0; c < virtual_stages; ++c) out.push_back(At(stage, c));
  return out;
}

double StagePartition::StageCost(int64_t stage) const {
  double total = 0;
  for (int64_t c = 0; c < virtual_stages; ++c) total += At(stage, c).cost;
  return total;
}

double StagePartition::MaxChunkCost() const {
  double m = 0;
  for (const ModelChunk& c : chunks) m = std::max(m, c.cost);
  return m;
}

absl::StatusOr<StagePartition> PartitionLayers(const PartitionRequest& request) {
  if (request.pp < 1) {
    return absl::InvalidArgumentError(absl::StrCat("pp=", request.pp, " must be >= 1"));
  }
  if (request.virtual_stages < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("virtual_stages=", request.virtual_stages, " must be >= 1"));
  }
  const int64_t n = request.num_layers;
  const int64_t k_total = request.pp * request.virtual_stages;
  if (n < k_total) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_layers=", n, " is fewer than pp*virtual_stages=", request.pp, "*",
        request.virtual_stages, "=", k_total, " model chunks; every chunk needs a layer"));
  }
  if (!request.layer_costs.empty() && static_cast<int64_t>(request.layer_costs.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat("layer_costs has ", request.layer_costs.size(),
                                                   " entries but num_layers=", n));
  }
  for (size_t i = 0; i < request.layer_costs.size(); ++i) {
    if (!(request.layer_costs[i] > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer_costs[", i, "]=", request.layer_costs[i], " must be > 0"));
    }
  }
  EndCosts ends;
  if (request.end_costs.has_value()) {
    ends = *request.end_costs;
  } else {
    absl::StatusOr<EndCosts> derived = DefaultEndCosts(request.dims);
    if (!derived.ok()) return derived.status();
    ends = *derived;
  }
  if (!(ends.embedding >= 0) || !(ends.lm_head >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat("end costs (embedding=", ends.embedding,
                                                   ", lm_head=", ends.lm_head,
                                                   ") must be >= 0"));
  }

  std::vector<double> prefix(n + 1, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    prefix[i + 1] = prefix[i] + (request.layer_costs.empty() ? 1.0 : request.layer_costs[i]);
  }
  // Cost of chunk k holding layers [j, i).
  auto chunk_cost = [&](int64_t k, int64_t j, int64_t i) {
    double c = prefix[i] - prefix[j];
    if (k == 0) c += ends.embedding;
    if (k == k_total - 1) c += ends.lm_head;
    return c;
  };

  // Pass 1: the smallest possible maximum chunk cost. best[k][i]: first i
  // layers in chunks 0..k-1.
  std::vector<std::vector<double>> best(k_total + 1, std::vector<double>(n + 1, kInf));
  best[0][0] = 0;
  for (int64_t k = 1; k <= k_total; ++k) {
    for (int64_t i = k; i <= n - (k_total - k); ++i) {
      for (int64_t j = k - 1; j < i; ++j) {
        if (best[k - 1][j] == kInf) continue;
        best[k][i] = std::min(best[k][i], std::max(best[k - 1][j], chunk_cost(k - 1, j, i)));
      }
    }
  }
  const double limit = best[k_total][n] + kTolerance;

  // Pass 2: among cuts within that maximum, the least sum of squares.
  std::vector<std::vector<double>> sq(k_total + 1, std::vector<double>(n + 1, kInf));
  sq[0][0] = 0;
  for (int64_t k = 1; k <= k_total; ++k) {
    for (int64_t i = k; i <= n - (k_total - k); ++i) {
      for (int64_t j = k - 1; j < i; ++j) {
        if (sq[k - 1][j] == kInf) continue;
        const double c = chunk_cost(k - 1, j, i);
        if (c > limit) continue;
        sq[k][i] = std::min(sq[k][i], sq[k - 1][j] + c * c);
      }
    }
  }

  // Walk back from the end; the smallest start for the last chunk among ties
  // makes later chunks the larger ones.
  std::vector<int64_t> starts(k_total + 1, 0);
  starts[k_total] = n;
  int64_t i = n;
  for (int64_t k = k_total; k >= 1; --k) {
    int64_t pick = -1;
    for (int64_t j = k - 1; j < i; ++j) {
      if (sq[k - 1][j] == kInf) continue;
      const double c = chunk_cost(k - 1, j, i);
      if (c > limit) continue;
      const double total = sq[k - 1][j] + c * c;
      if (total <= sq[k][i] + kTolerance * std::max(1.0, sq[k][i])) {
        pick = j;
        break;
      }
    }
    if (pick < 0) return absl::InternalError("stage partition: no cut reconstructs the optimum");
    starts[k - 1] = pick;
    i = pick;
  }

  StagePartition out;
  out.pp = request.pp;
  out.virtual_stages = request.virtual_stages;
  out.end_costs = ends;
  for (int64_t k = 0; k < k_total; ++k) {
    ModelChunk c;
    c.virtual_stage = k;
    c.stage = k % request.pp;
    c.chunk = k / request.pp;
    c.first_layer = starts[k];
    c.num_layers = starts[k + 1] - starts[k];
    c.has_embedding = k == 0;
    c.has_lm_head = k == k_total - 1;
    c.cost = chunk_cost(k, starts[k], starts[k + 1]);
    out.chunks.push_back(c);
  }
  return out;
}

}  // namespace loom::topology
