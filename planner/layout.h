// A parallel layout and the training workload it runs: the values every
// planner estimate takes. A layout fixes the five axes (dp·tp·pp·cp·ep =
// ranks), the ZeRO stage, how the global batch is cut (mbs·gas·dp = global
// batch), the pipeline schedule, sequence parallelism and recompute.
#pragma once

#include <cstdint>
#include <string>

#include "common/spec/job_spec.h"
#include "common/spec/layout.h"
#include "planner/model_math.h"
#include "planner/precision.h"

namespace loom::planner {

// The job's layout type (common/spec/layout.h): what the planner ranks is what
// submission writes into the spec and the mesh runs.
using Layout = spec::Layout;

// "dp=8 tp=2 pp=1 cp=1 ep=1 zero=1 mbs=2 gas=8 1f1b sp recompute=none".
std::string LayoutToString(const Layout& layout);
const char* ScheduleLabel(spec::Schedule schedule);
const char* RecomputeLabel(spec::Recompute recompute);

// What is trained: the model, the sequence length, the global batch in
// sequences and the precision recipe. The parameter count is computed once.
struct Workload {
  ModelShape model;
  ParamCount params;
  int64_t seq_len = 0;
  int64_t global_batch = 0;  // sequences per optimizer step
  RecipeKind recipe = RecipeKind::kBf16Fp32Accum;
  double dp_bucket_bytes = 25.0 * (1 << 20);  // DP gradient bucket (parallelism.bucket_mb)
  // [in-place recovery] Copies of its whole state each rank keeps in host
  // memory (docs/fault_tolerance.md): three generations of its own snapshot
  // and three of its ward's, 6, when fault_tolerance.snapshot_interval > 0;
  // else 0 (common/snapshot_generations.h).
  int64_t snapshot_copies = 0;
  // Whether a rank's host memory is its device memory (CPU ranks): its
  // snapshots then count in its memory, else beside it (memory_model.h).
  bool host_is_device = false;
};

// Whole-state copies a rank keeps for in-place recovery at this
// fault_tolerance.snapshot_interval: 5 when it snapshots at all, else 0.
int64_t SnapshotCopies(int64_t snapshot_interval);

Workload MakeWorkload(const ModelShape& model, int64_t seq_len, int64_t global_batch,
                      RecipeKind recipe);

}  // namespace loom::planner
