// The measured training runs the planner is calibrated and validated on
// (tools/planner/data, described in its README): the Ultra-Scale Playbook's nanotron runs on H100 nodes
// and vTrain's Megatron-LM runs on A100 nodes. Parsing is pure; LoadRuns
// reads the directory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "planner/constants.h"
#include "planner/search.h"

namespace loom::planner::eval {

struct PlaybookRun {
  std::string model;  // 1B, 3B, 8B, 80B
  int64_t nodes = 0, dp = 0, tp = 0, pp = 0, mbs = 0, gas = 0, zero = 0;
  bool ok = false;    // false: crashed or out of memory
  double mfu_pct = 0, tok_s_gpu = 0, mem_gb = 0;
};

// The playbook's mem_gb is rank 0's peak, i.e. the first pipeline stage's:
// where the model puts the last stage (LM head, logits) well above the first,
// the measured peak matches the first stage (21 such runs: 14.6% mean error
// against the first stage, 29.8% against the larger last one). A run crashes
// when any stage runs out, so fit-or-not still takes the largest.
inline constexpr int64_t kPlaybookMeasuredStage = 0;

struct VtrainRun {
  bool multi = false;  // from the multi-node file
  int64_t gpus = 0, global_batch = 0, mbs = 0, hidden = 0, heads = 0, layers = 0, seq = 0;
  int64_t tp = 0, dp = 0, pp = 0;
  double iteration_ms = 0;
};

absl::StatusOr<std::vector<PlaybookRun>> ParsePlaybookCsv(absl::string_view text);
// Columns are found by name; a UTF-8 byte-order mark is skipped.
absl::StatusOr<std::vector<VtrainRun>> ParseVtrainCsv(absl::string_view text, bool multi);

struct MeasuredRuns {
  std::vector<PlaybookRun> playbook;
  std::vector<VtrainRun> vtrain;  // multi then single
};

// Reads ultrascale_playbook_runs.csv and vtrain_megatron_a100_{multi,single}.csv
// from `dir`; the error names the file it could not read.
absl::StatusOr<MeasuredRuns> LoadRuns(const std::string& dir);

// The planner's view of a playbook run: Llama shape, H100 nodes, nanotron's
// settings (bf16 with fp32 accumulation, 1F1B, uneven stages allowed).
// PlaybookConstants adds what nanotron's code fixes: its ZeRO-1 keeps torch
// DDP's gradient all-reduce and all-gathers the updated weights after.
PlannerConstants PlaybookConstants(PlannerConstants constants);
Workload PlaybookWorkload(const PlaybookRun& run);
Layout PlaybookLayout(const PlaybookRun& run);
ClusterSpec PlaybookCluster(const PlaybookRun& run);
// The planner's rules, with nanotron's freedoms (uneven stages, TP across nodes).
bool PlaybookLayoutValid(const PlaybookRun& run);

// vTrain's runs: GPT-3-style models (LayerNorm, GELU MLP of 4h, biases,
// learned positions, tied 51,200-token vocabulary) under Megatron-LM with
// full activation checkpointing and 1F1B, on 8-GPU A100 nodes. vTrain's
// model code is Megatron's classic path: fp16 (gradients all-reduced in
// fp16, no fp32 accumulation), unfused attention (scores materialized, with
// dropout), no sequence parallelism. The cluster: A100 80 GB nodes with
// 800 Gb/s of network each (vTrain's configs). Score them with
// MegatronConstants().
Workload VtrainWorkload(const VtrainRun& run);
Layout VtrainLayout(const VtrainRun& run);
ClusterSpec VtrainCluster(const VtrainRun& run);

}  // namespace loom::planner::eval
