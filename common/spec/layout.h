// A job's resolved parallel layout: the one layout type. The rank mesh takes
// its axes (topology::MeshShape is this type), the planner estimates and ranks
// it (planner::Layout is this type), the coordinator sends it as
// loom.v1.Layout (its wire form, coordinator/jobs/layout_proto.h) and
// common/topology/job_plan.h derives the pipeline plan from it.
// spec::ParallelismSpec stays what the user wrote (axes may be unset or
// `auto`); LayoutOf resolves it and ApplyLayout writes a searched one back.
// Pure logic, no I/O.
#pragma once

#include <cstdint>

#include "common/spec/job_spec.h"

namespace loom::spec {

struct Layout {
  // The five mesh axes in mesh order, slowest first (common/topology/mesh.h),
  // so that {pp, dp, ep, cp, tp} and designated initializers read as a mesh.
  int64_t pp = 1;
  int64_t dp = 1;
  int64_t ep = 1;
  int64_t cp = 1;
  int64_t tp = 1;
  int zero_stage = 0;
  int64_t micro_batch_size = 1;  // sequences per forward/backward on one DP rank
  int64_t grad_accum = 1;        // micro-batches per optimizer step on one DP rank
  Schedule schedule = Schedule::k1F1B;
  int64_t virtual_stages = 1;    // model chunks per pipeline rank (interleaved)
  bool sequence_parallel = false;
  Recompute recompute = Recompute::kNone;

  int64_t world() const { return pp * dp * ep * cp * tp; }
  // Ranks that train on different data: the DP replicas and the expert-
  // parallel ranks, which route their own tokens to each other's experts
  // (docs/moe.md). Dense weights are data-parallel over all of them, the
  // experts over dp.
  int64_t data_replicas() const { return dp * ep; }
  bool operator==(const Layout&) const = default;
};

// The layout of a spec: unset axes count as 1, an unset ZeRO stage as 0,
// grad_accum = train.global_batch_size / (dp * ep * train.micro_batch_size)
// (0 when that product is not positive).
Layout LayoutOf(const JobSpec& spec);

// Writes a resolved layout into the spec (every axis set, `auto` cleared);
// LayoutOf(spec) gives it back.
void ApplyLayout(const Layout& layout, JobSpec* spec);

}  // namespace loom::spec
