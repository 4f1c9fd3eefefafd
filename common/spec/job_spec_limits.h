// Upper bounds on every size a job spec can ask for. A spec is text a user
// sends to a shared service: without bounds, one field (num_layers: 1e9,
// ranks: 1e9) makes the coordinator allocate and compute without end. These
// bounds are far above any model Loom trains, far below what would hurt the
// coordinator, and keep every product of two of them inside int64. Every
// limit, its default and what changes it is listed in docs/limits.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/spec/job_spec.h"

namespace loom::spec {

struct JobSpecLimits {
  int64_t max_vocab_size = int64_t{1} << 22;         // 4,194,304
  int64_t max_hidden_size = int64_t{1} << 17;        // 131,072
  int64_t max_num_layers = 4096;
  int64_t max_num_heads = 4096;
  int64_t max_ffn_hidden_size = int64_t{1} << 20;    // 1,048,576
  int64_t max_num_experts = 4096;                    // model.moe.num_experts, top_k, shared
  int64_t max_seq_len = int64_t{1} << 22;            // model.max_seq_len and train.seq_len
  int64_t max_steps = 100'000'000;                   // train.steps
  int64_t max_global_batch_size = int64_t{1} << 24;  // sequences per step
  int64_t max_eval_windows = 1'000'000;
  int64_t max_ranks = int64_t{1} << 20;              // world size and every parallel axis
  int64_t max_gpus_per_node = 64;
  int64_t max_virtual_stages = 1024;
  int64_t max_bucket_mb = int64_t{1} << 16;
  int64_t max_checkpoint_keep = 10'000;
  int64_t max_restarts = 10'000;                     // every restart budget and cordon_after
  double max_seconds = 7 * 24 * 3600.0;              // hang timeout and restart backoff
  int64_t max_path_bytes = 4096;                     // data and checkpoint paths
  int64_t max_priority = 1'000'000;                  // |scheduling.priority|
  double max_runtime_s = 366 * 24 * 3600.0;          // scheduling.max_runtime_s (a year)
};

// The bounds every program applies (coordinator, trainer, loomctl --offline).
const JobSpecLimits& DefaultJobSpecLimits();

// Every bound the spec exceeds, one message each naming the field, its value
// and the bound ("model.num_layers=1000000000 must be at most 4096"); empty
// when every size is within bounds. Called by CheckJobSpec before any
// cross-field rule, so those never compute with unbounded values.
std::vector<std::string> CheckJobSpecLimits(const JobSpec& spec,
                                            const JobSpecLimits& limits = DefaultJobSpecLimits());

}  // namespace loom::spec
