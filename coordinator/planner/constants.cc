// Fitted values of the planner's free constants. Regenerate with
//   build/bin/planner_calibrate --from_scratch --rounds=12
// and keep docs/planner.md's table and tests/planner's floors in step.
#include "coordinator/planner/constants.h"

namespace loom::planner {

PlannerConstants DefaultConstants() {
  PlannerConstants k;
  // Fitted by `planner_calibrate --from_scratch --rounds=12` on the 4,710
  // playbook runs; docs/planner.md explains each value.
  k.memory_overhead_bytes = 1.73041e+08;
  k.activation_factor = 2.0002;
  k.logits_bytes_per_element = 8.04598;
  k.gemm_peak_efficiency = 0.75;
  k.gemm_tokens_half = 746.486;
  k.gemm_width_half = 19.6627;
  k.layer_overhead_s = 0.0003;
  k.intra_bandwidth_efficiency = 0.315745;
  k.inter_bandwidth_efficiency = 1;
  k.intra_latency_s = 0.0002;
  k.inter_latency_s = 0.00188918;
  k.p2p_latency_s = 0.0102097;
  k.tp_overlap = 0;
  k.dp_overlap = 0.01;
  return k;
}

PlannerConstants CpuEngineConstants() {
  PlannerConstants k = DefaultConstants();
  // No CUDA context or workspace: what remains is the process, OpenBLAS
  // buffers and Gloo's pairs.
  k.memory_overhead_bytes = 64.0 * (1 << 20);
  k.activation_factor = 1.0;
  k.logits_bytes_per_element = 12.0;  // fp32 logits, softmax and gradient
  k.attention_score_bytes = 4.0;      // fp32 softmax probabilities are saved
  k.tp_overlap = 0.0;
  k.dp_overlap = 0.0;
  return k;
}

}  // namespace loom::planner
