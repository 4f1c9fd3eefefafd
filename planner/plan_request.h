// From a job spec to a planner request, and back: which cluster preset and
// recipe a spec means, which axes it fixes and which it leaves to the
// search (a chosen layout is written back with spec::ApplyLayout,
// common/spec/layout.h).
#pragma once

#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "planner/cluster.h"
#include "planner/search.h"

namespace loom::planner {

// The cluster a job's resources describe: the preset named by resources.gpu
// (or the CPU preset, one node of `ranks` ranks), with a node's host memory
// from resources.host_memory_mb and `overrides` applied (a CPU agent's
// measured peak, a site's bandwidths).
absl::StatusOr<ClusterSpec> ClusterForJob(const spec::ResourcesSpec& resources,
                                          const ClusterOverrides& overrides = {});

// `parallelism: auto` searches every axis, the micro-batch size, recompute
// and sequence parallelism; otherwise the axes the spec gives are fixed and
// so are train.micro_batch_size (unless it is `auto`), parallelism.recompute and
// parallelism.sequence_parallel. CPU jobs use CpuEngineConstants(). With
// fault_tolerance.snapshot_interval > 0 every rank's in-place recovery
// snapshots are counted (Workload::snapshot_copies).
absl::StatusOr<PlanRequest> PlanRequestFromJob(const spec::JobSpec& job,
                                               const ClusterOverrides& overrides = {});

}  // namespace loom::planner
