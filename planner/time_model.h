// Time per optimizer step of a layout: compute from hardware FLOPs, the
// device peak and a GEMM-shape efficiency; per-axis communication volumes
// over the link each axis crosses (NVLink inside a node, the NIC between
// nodes), less the overlap each axis allows; the schedule's pipeline bubble;
// the optimizer step. Also tokens/s, MFU and HFU.
#pragma once

#include "planner/cluster.h"
#include "planner/constants.h"
#include "planner/layout.h"

namespace loom::planner {

struct StepTime {
  // Seconds per optimizer step; the parts add up to `total`.
  double compute = 0;      // GEMMs and attention of all micro-batches on the slowest stage
  double tp_comm = 0;      // exposed TP/SP collectives
  double cp_comm = 0;      // exposed context-parallel K/V exchange
  double ep_comm = 0;      // [moe] the experts' all-to-all dispatch and combine
  double pp_comm = 0;      // pipeline sends and receives
  double bubble = 0;       // pipeline fill and drain
  double dp_comm = 0;      // exposed gradient reduction and ZeRO gathers
  double optimizer = 0;    // the optimizer step (memory-bound)
  double total = 0;

  double bubble_fraction = 0;   // bubble / total
  double tokens_per_second = 0; // whole job
  double tokens_per_second_per_device = 0;
  double mfu = 0;  // model FLOPs (6N + 12·L·h·s per token) over peak
  double hfu = 0;  // hardware FLOPs (with recompute) over peak
};

// GEMM efficiency in (0, 1] for `tokens` rows and per-rank `width` columns.
double GemmEfficiency(double tokens, double width, const PlannerConstants& constants);

// Seconds for a ring collective on a buffer of `bytes` (all-reduce: the
// buffer; all-gather: its output; reduce-scatter: its input) over `group`
// ranks, `ranks_per_node` of which share a node (the group crosses nodes iff
// ranks_per_node < group). `passes` is 2 for all-reduce, 1 for all-gather or
// reduce-scatter. NCCL's ring: a fixed cost per call, then per pass g-1
// steps, of which one per extra node crosses the network; the data moves at
// the slowest link's rate. Across nodes that rate is a GPU's NIC share times
// the NIC shares the group's ranks on a node can use (nic_spread): the
// concurrent groups of a node share its NICs.
double CollectiveSeconds(double bytes, int64_t group, double passes, int64_t ranks_per_node,
                         const ClusterSpec& cluster, const PlannerConstants& constants);

// Bytes one rank of a context-parallel ring sends for one layer and one
// micro-batch, given the K/V of the whole sequence on its TP rank
// (`kv_bytes`): the engine's ring (worker/engine/context_parallel/
// ring_attention.h) passes its K/V block on cp - 1 times forward, and in the
// backward the K/V block again plus the travelling dK/dV accumulator cp
// times (the last one home). A recompute repeats the forward's traffic.
struct CpRingBytes {
  double forward = 0;
  double backward = 0;
};
CpRingBytes CpRingBytesPerLayer(double kv_bytes, int64_t cp);

// Ranks of a mesh group with `size` members `stride` ranks apart that share
// one node of `devices_per_node`.
int64_t GroupRanksPerNode(int64_t size, int64_t stride, int64_t devices_per_node);

StepTime EstimateStepTime(const Workload& workload, const Layout& layout,
                          const ClusterSpec& cluster, const PlannerConstants& constants);

}  // namespace loom::planner
