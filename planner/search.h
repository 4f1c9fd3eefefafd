// Layout search: enumerate every valid layout of a workload on a cluster
// (the rulebook's rules, common/spec/job_spec_rules.h: heads, KV heads, FFN,
// layers and sequence divisible as each axis needs, the batch split, the ZeRO
// stage, the schedule; dp·tp·pp·cp·ep = ranks; and the search's own choices:
// TP inside a node, even stages), reject those that do not fit in memory
// (the device's, and the node's host memory for snapshots when the cluster
// gives it) with the reason, rank the rest by predicted step time. Axes the
// user fixed are held; the rest are searched.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "planner/cluster.h"
#include "planner/constants.h"
#include "planner/layout.h"
#include "planner/memory_model.h"
#include "planner/time_model.h"

namespace loom::planner {

// What the search may vary. An axis with a value is fixed; nullopt is searched.
struct SearchSpace {
  std::optional<int64_t> dp, tp, pp, cp, ep;
  std::optional<int> zero_stage;
  std::optional<int64_t> micro_batch_size;
  std::optional<spec::Recompute> recompute;
  std::optional<bool> sequence_parallel;  // nullopt: on whenever tp > 1
  spec::Schedule schedule = spec::Schedule::k1F1B;
  int64_t virtual_stages = 1;
  int max_zero_stage = 3;
  bool tp_within_node = true;
  // Let pipeline stages hold unequal numbers of layers (nanotron does,
  // Loom's engine does not).
  bool allow_uneven_stages = false;
  // Share of device memory the search prefers to leave free: a layout
  // predicted above (1 - memory_headroom) of it is "tight" and ranks after
  // every layout that is not (what no model counts: allocator fragmentation,
  // library workspaces). In the playbook, runs predicted above 75% of the
  // device crashed 2.6-5x as often as the rest (docs/planner.md).
  double memory_headroom = 0.10;
  // When set, only layouts it accepts are enumerated: submission passes the
  // spec's rules and the engine's (spec::CheckJobSpec, spec::CheckEngineRuns)
  // so that `parallelism: auto` answers with a layout the ranks run.
  std::function<bool(const Layout&)> accept;
  // Also search the pipeline schedule (1f1b, afab, interleaved with two
  // virtual stages) when pp > 1, and sequence parallelism on and off when
  // tp > 1 and `sequence_parallel` is unset: what `parallelism: auto` does.
  bool search_schedules = false;
  // Whether the interleaved schedule may be chosen (a framework profile
  // without it: nanotron runs afab and 1f1b only).
  bool allow_interleaved = true;
};

struct PlanRequest {
  Workload workload;
  ClusterSpec cluster;
  PlannerConstants constants = DefaultConstants();
  SearchSpace space;
};

struct Candidate {
  Layout layout;
  MemoryBreakdown memory;
  StepTime time;
  bool tight = false;  // fits, but inside the memory headroom
  // Host memory one node needs beyond its devices': its ranks' in-place
  // recovery snapshots (GPU nodes; 0 where none are kept or host memory is
  // the device).
  double host_bytes_per_node = 0;
};

struct Rejection {
  Layout layout;
  MemoryBreakdown memory;
  double capacity_bytes = 0;       // the device's
  double host_bytes_per_node = 0;  // as Candidate's
  double host_capacity_bytes = 0;  // the node's host memory (0: not checked)
  // "out of memory: needs 91.2 GiB on stage 0 (activations 60.1 GiB, ...) of
  // 79.6 GiB", or, for the node's host memory, "out of host memory: ...".
  std::string Reason() const;
};

struct PlanResult {
  std::vector<Candidate> ranked;   // fastest first, tight ones after the rest
  std::vector<Rejection> rejected; // did not fit, in enumeration order
  int64_t layouts_considered = 0;
};

// Checks one layout against the workload and cluster; the error names the
// field (parallelism.tp, train.micro_batch_size, ...) and the rule it breaks.
absl::Status ValidateLayout(const Workload& workload, const ClusterSpec& cluster,
                            const Layout& layout, const SearchSpace& space = {});

// Every valid layout in the search space, in a deterministic order.
std::vector<Layout> EnumerateLayouts(const Workload& workload, const ClusterSpec& cluster,
                                     const SearchSpace& space);

// Estimates one layout (no validity check).
Candidate EvaluateLayout(const Workload& workload, const ClusterSpec& cluster,
                         const PlannerConstants& constants, const Layout& layout);

// Host memory one node of the cluster needs beyond its devices' for a layout
// with this memory: every rank's snapshots.
double HostBytesPerNode(const ClusterSpec& cluster, const MemoryBreakdown& memory);

// Why a layout with this memory does not fit the cluster: the device's
// memory, or the node's host memory when the cluster gives it. nullopt: fits.
std::optional<Rejection> CheckFits(const ClusterSpec& cluster, const Layout& layout,
                                   const MemoryBreakdown& memory);

// Enumerates, estimates, rejects and ranks. Fails when no layout is valid
// (naming the rule that excluded them); an empty `ranked` with rejections
// means every valid layout runs out of memory.
absl::StatusOr<PlanResult> PlanLayouts(const PlanRequest& request);

}  // namespace loom::planner
