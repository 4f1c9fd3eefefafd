// The sweep: model sizes × node counts → the best layout of each cell, the
// shape of the Ultra-Scale Playbook's heatmap, as a text table, JSON and an
// SVG picture.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/search.h"
#include "nlohmann/json.hpp"

namespace loom::planner {

struct SweepModel {
  std::string label;  // "8B"
  ModelShape shape;
};

struct SweepRequest {
  ClusterSpec cluster;  // devices_per_node is used; nodes come from node_counts
  std::vector<SweepModel> models;
  std::vector<int64_t> node_counts;
  int64_t seq_len = 4096;
  int64_t global_batch = 256;  // sequences
  RecipeKind recipe = RecipeKind::kBf16Fp32Accum;
  PlannerConstants constants = DefaultConstants();
  SearchSpace space;
};

struct SweepCell {
  std::string model;
  int64_t nodes = 0;
  std::optional<Candidate> best;  // nullopt: nothing fits (or no valid layout)
  int64_t considered = 0;
  int64_t fit = 0;
  std::string note;  // why the cell is empty
};

struct SweepResult {
  ClusterSpec cluster;
  int64_t seq_len = 0;
  int64_t global_batch = 0;
  std::vector<std::string> models;
  std::vector<int64_t> node_counts;
  std::vector<SweepCell> cells;  // row-major: models × node_counts

  const SweepCell& cell(size_t model, size_t nodes) const {
    return cells[model * node_counts.size() + nodes];
  }
};

// The playbook's Llama-3-style shapes: 1B, 3B, 8B and 80B (vocabulary
// 131,072, full multi-head attention).
std::vector<SweepModel> PlaybookModels();

// The playbook's grid: its four models on 1–64 nodes, seq 4096, 1M tokens.
SweepRequest PlaybookSweep(const ClusterSpec& cluster);

absl::StatusOr<SweepResult> RunSweep(const SweepRequest& request);

std::string RenderSweepTable(const SweepResult& result);
std::string RenderSweepSvg(const SweepResult& result);
nlohmann::json SweepToJson(const SweepResult& result);

}  // namespace loom::planner
