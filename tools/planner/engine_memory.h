// The CPU engine's measured peak memory per layout (the CSV that
// planner_engine_memory writes from the engine's MemoryTracker) and the
// planner's prediction for each layout: parsing is pure, the comparison is
// EstimateMemory with CpuEngineConstants() on the fp32 recipe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "planner/constants.h"
#include "planner/layout.h"
#include "planner/memory_model.h"

namespace loom::planner::eval {

// One layout of one model shape, the peaks of its worst rank (largest total
// peak) as the engine measured them, in bytes.
struct EngineMemoryCase {
  std::string shape;
  spec::ModelSpec model;
  int64_t seq_len = 0, micro_batch = 0, global_batch = 0, bucket_mb = 0;
  int64_t dp = 1, tp = 1, zero = 0;
  bool sp = false;
  spec::Recompute recompute = spec::Recompute::kNone;
  int ranks = 0;  // rows (ranks) the CSV had for the layout
  // Worst rank's peaks: parameters, gradients, optimizer, activations,
  // comm buffers (each kind's own peak) and the peak of their sum.
  double parameters = 0, gradients = 0, optimizer = 0, activations = 0, comm_buffers = 0;
  double total_peak = 0;
  double best_rank_total_peak = 0;  // the smallest rank's total peak

  std::string Label() const;  // "dp2 tp1 zero3" / "dp2·tp2+sp zero1" / "dp1 recompute=full"
};

// Parses the CSV (lines starting with '#' are comments; columns by name).
// Rows of one (shape, layout) are merged into one case.
absl::StatusOr<std::vector<EngineMemoryCase>> ParseEngineMemoryCsv(absl::string_view text);
absl::StatusOr<std::vector<EngineMemoryCase>> LoadEngineMemoryCsv(const std::string& path);

// The planner's view of a case: the fp32 recipe, the shape's batch and
// bucket, the layout's axes (gas = global / (mbs · dp)).
Workload EngineWorkload(const EngineMemoryCase& c);
Layout EngineLayout(const EngineMemoryCase& c);

struct EngineMemoryComparison {
  EngineMemoryCase measured;
  MemoryBreakdown predicted;
  // What the engine's accounting covers: the prediction less the fixed
  // process overhead (the tracker counts the engine's buffers only).
  double predicted_accounted = 0;
  double relative_error = 0;  // predicted_accounted / measured total_peak - 1
};

std::vector<EngineMemoryComparison> CompareEngineMemory(const std::vector<EngineMemoryCase>& cases,
                                                        const PlannerConstants& constants);

// A markdown table (MiB): measured and predicted per category and in total.
std::string RenderEngineMemoryTable(const std::vector<EngineMemoryComparison>& rows);

}  // namespace loom::planner::eval
