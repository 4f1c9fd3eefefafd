#include "tools/loadgen/sched_workload.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace loom::loadgen {

SchedWorkload MakeSchedWorkload(const SchedWorkloadOptions& options) {
  SchedWorkload workload;
  workload.gpu_quota = {{"user-0", std::max<int64_t>(1, options.devices / 4)},
                        {"user-1", std::max<int64_t>(1, options.devices / 8)}};
  std::mt19937 rng(options.seed);
  const int64_t sizes[] = {1, 2, 4, 8, 8, 16, 32, 64, 128, 256};
  const int64_t priorities[] = {0, 0, 0, 0, 1, 1, 5};
  const int64_t largest = std::max<int64_t>(1, options.devices / 4);
  for (int i = 0; i < options.jobs; ++i) {
    SchedJobPlan j;
    j.name = absl::StrFormat("sched-%05d", i);
    j.user = absl::StrCat("user-", i % options.users);
    j.priority = priorities[rng() % 7];
    j.devices = std::min(sizes[rng() % 10], largest);
    if (auto q = workload.gpu_quota.find(j.user); q != workload.gpu_quota.end()) {
      j.devices = std::min(j.devices, q->second);
    }
    if (j.devices > 8) j.devices -= j.devices % 8;  // whole nodes of 8 in the spec
    j.steps = options.min_steps +
              static_cast<int64_t>(
                  rng() % static_cast<uint32_t>(options.max_steps - options.min_steps + 1));
    // Promised with room for launch and exit latency; a fifth promise nothing
    // (they never backfill, and reservations behind them are unknown).
    const double runtime = static_cast<double>(j.steps) * options.step_s;
    j.max_runtime_s = (rng() % 5 == 0) ? 0 : std::ceil(runtime * 1.5 + 2);
    workload.jobs.push_back(j);
  }
  return workload;
}

std::string SchedJobSpec(const SchedJobPlan& job) {
  const int64_t per_node = std::min<int64_t>(job.devices, 8);
  const int64_t nodes = (job.devices + per_node - 1) / per_node;
  return absl::StrFormat(R"(name: %s
model: {vocab_size: 256, hidden_size: 64, num_layers: 2, num_heads: 4, num_kv_heads: 2,
        ffn_hidden_size: 128, max_seq_len: 64, rope_theta: 10000, tie_embeddings: false}
train: {steps: %d, global_batch_size: %d, micro_batch_size: 1, seq_len: 32, lr: 3.0e-3,
        warmup_steps: 1, lr_schedule: cosine, weight_decay: 0.1, grad_clip: 1.0, seed: 3,
        precision: bf16, eval_interval: 0, eval_windows: 4}
data: {train_path: data/train.txt, format: text}
parallelism: {dp: %d, tp: 1, pp: 1, cp: 1, ep: 1, zero_stage: 0}
resources: {device: gpu, gpu: h200, nodes: %d, gpus_per_node: %d}
fault_tolerance: {max_restarts: 0, hang_timeout_s: 0}
scheduling: {priority: %d, max_runtime_s: %g}
)",
                         job.name, job.steps, job.devices, job.devices, nodes, per_node,
                         job.priority, job.max_runtime_s);
}

}  // namespace loom::loadgen
