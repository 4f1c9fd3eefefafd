// The table of fitted constants and their bounds.
#include "tools/planner/constant_table.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace loom::planner::eval {

using K = PlannerConstants;

const std::vector<ConstantParam>& MemoryConstants() {
  static const std::vector<ConstantParam>* table = new std::vector<ConstantParam>{
      {"memory_overhead_bytes", &K::memory_overhead_bytes, 64e6, 16e9},
      {"activation_factor", &K::activation_factor, 0.5, 4.0},
      {"logits_bytes_per_element", &K::logits_bytes_per_element, 2.0, 24.0},
      {"activation_working_sets", &K::activation_working_sets, 0.0, 8.0},
      {"backward_scratch_layers", &K::backward_scratch_layers, 0.0, 8.0},
  };
  return *table;
}

const std::vector<ConstantParam>& TimeConstants() {
  // Bounds keep each constant physical: no GEMM beats 75% of peak (cuBLAS
  // on H100 reaches ~750 of 989 TFLOP/s), no link runs above its nominal
  // rate, a collective's fixed cost stays within what NCCL shows on NVLink
  // (tens of µs) and across nodes (up to a few ms at hundreds of ranks), and
  // a layer's host work within what an eager Python framework spends
  // launching a layer's few dozen kernels (µs to a few ms).
  static const std::vector<ConstantParam>* table = new std::vector<ConstantParam>{
      {"gemm_peak_efficiency", &K::gemm_peak_efficiency, 0.3, 0.75},
      {"gemm_tokens_half", &K::gemm_tokens_half, 16, 16384},
      {"gemm_width_half", &K::gemm_width_half, 4, 4096},
      {"layer_overhead_s", &K::layer_overhead_s, 1e-6, 5e-3},
      {"host_overlap", &K::host_overlap, 0.0, 1.0},
      {"intra_bandwidth_efficiency", &K::intra_bandwidth_efficiency, 0.1, 1.0},
      {"inter_bandwidth_efficiency", &K::inter_bandwidth_efficiency, 0.05, 1.0},
      {"intra_latency_s", &K::intra_latency_s, 5e-6, 2e-4},
      {"inter_latency_s", &K::inter_latency_s, 2e-5, 2e-3},
      {"collective_launch_s", &K::collective_launch_s, 5e-6, 2e-3},
      {"nic_spread", &K::nic_spread, 0.0, 1.0},
      {"p2p_latency_s", &K::p2p_latency_s, 5e-6, 0.1},
      {"tp_overlap", &K::tp_overlap, 0.0, 0.95},
      {"dp_overlap", &K::dp_overlap, 0.01, 1.0},
  };
  return *table;
}

absl::Status SetConstant(absl::string_view assignment, PlannerConstants* k) {
  const size_t eq = assignment.find('=');
  if (eq == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("--set '", assignment, "': expected NAME=VALUE"));
  }
  const absl::string_view name = assignment.substr(0, eq);
  double value = 0;
  if (!absl::SimpleAtod(assignment.substr(eq + 1), &value)) {
    return absl::InvalidArgumentError(absl::StrCat("--set ", name, ": '", assignment.substr(eq + 1),
                                                   "' is not a number"));
  }
  std::string known;
  for (const auto* table : {&MemoryConstants(), &TimeConstants()}) {
    for (const ConstantParam& p : *table) {
      if (name == p.name) {
        k->*(p.field) = value;
        return absl::OkStatus();
      }
      absl::StrAppend(&known, known.empty() ? "" : ", ", p.name);
    }
  }
  if (name == "zero1_reduce_scatter") {
    k->zero1_reduce_scatter = value != 0;
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("--set: no constant '", name, "'; known: ", known,
                                                 ", zero1_reduce_scatter"));
}

}  // namespace loom::planner::eval
