// The planner's free constants: a handful of numbers, each with a physical
// meaning, that the analytic memory and time models cannot derive from first
// principles. They are fitted once, on the Ultra-Scale Playbook runs
// (tools/planner/calibrate), never per model or per cluster cell.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"

namespace loom::planner {

struct PlannerConstants {
  // Compute: a GEMM reaches gemm_peak_efficiency of the device peak when it
  // is large; efficiency halves when the rows (tokens per micro-batch per
  // rank) fall to gemm_tokens_half, and again when the per-rank width
  // (hidden / tp) falls to gemm_width_half.
  double gemm_peak_efficiency = 0.7;
  double gemm_tokens_half = 512;
  double gemm_width_half = 256;

  // The host's cost per layer per micro-batch (forward and backward; full
  // recompute adds a third): kernel launches and framework work that do not
  // shrink with the GEMMs. The host runs ahead of the device, so a share
  // `host_overlap` of the shorter of the two (host work, device work) is
  // hidden behind the longer: 0 adds them, 1 takes the larger.
  double layer_overhead_s = 0.0;
  double host_overlap = 0.0;

  // Communication: the fraction of a link's nominal bandwidth collectives
  // achieve (NCCL's bus bandwidth over the nominal rate), inside a node and
  // between nodes; the cost of each step of a ring over NVLink and over the
  // network; and a fixed cost per collective call (kernel launch, NCCL's
  // setup, the synchronization the framework adds around it).
  double intra_bandwidth_efficiency = 0.7;
  double inter_bandwidth_efficiency = 0.7;
  double intra_latency_s = 5e-6;
  double inter_latency_s = 10e-6;
  double collective_launch_s = 20e-6;
  // How much of a node's NICs one cross-node group uses: its ranks on a node
  // own that many NIC shares; 1: NCCL's rail-aligned rings spread the
  // group's traffic over all of them; 0: it stays on one share.
  double nic_spread = 1.0;
  // What a framework adds to each pipeline send or receive of one
  // micro-batch beyond NCCL's own cost (handshakes, the stall of a stage
  // that waits for it, a pipeline engine's host work).
  double p2p_latency_s = 100e-6;

  // Overlap: the fraction of in-layer collectives (TP, CP) hidden behind
  // compute, and the fraction of the last micro-batch's backward pass behind
  // which the data-parallel gradient reduction can hide.
  double tp_overlap = 0.0;
  double dp_overlap = 0.8;

  // How the framework reduces gradients under ZeRO-1. true: a reduce-scatter,
  // each rank receiving only the shard it updates (Megatron's distributed
  // optimizer, and what ZeRO-2/3 do by construction). false: the full
  // all-reduce of ZeRO-0, each rank then updating its shard (nanotron: torch
  // DDP under its ZeroDistributedOptimizer, i.e. the playbook's runs); ZeRO-1
  // then costs ZeRO-0's all-reduce plus the all-gather of the updated weights.
  // Not fitted: it is read from the framework's code.
  bool zero1_reduce_scatter = true;

  // Memory: a fixed per-rank overhead (CUDA context, cuBLAS workspace,
  // allocator reserve), a multiplier on activation bytes (allocator
  // fragmentation and the temporaries the formulas omit), the live bytes per
  // logit at the loss (bf16 logits, their fp32 copy, the fp32 gradient), and
  // the bytes per saved attention score (0 with fused/flash attention).
  double memory_overhead_bytes = 2.0 * (1 << 30);
  double activation_factor = 1.0;
  double logits_bytes_per_element = 10.0;
  double attention_score_bytes = 0.0;

  // How a framework lays out the rest of its memory. The defaults describe
  // the GPU frameworks the constants above were fitted on (their extra
  // allocations are in activation_factor); CpuEngineConstants() sets them
  // from the CPU engine's code, whose accounting is exact.
  //
  // Under SP, the norm outputs that feed the column-parallel GEMMs are saved
  // after their all-gather (all tokens) instead of sharded and gathered again
  // in backward.
  bool sp_saves_gathered_inputs = false;
  // Bytes per saved per-row statistic: each RMSNorm's 1/rms and the
  // attention's log-sum-exp per head (0: omitted, as Korthikanti et al. do).
  double row_stat_bytes = 0.0;
  // Layer-sized sets of forward activations held besides the saved ones (an
  // arena for evaluation passes); full recompute's working layer is one.
  double activation_working_sets = 0.0;
  // Layers' worth of activation gradients live during backward (the
  // gradients of one layer's GEMM outputs and its input).
  double backward_scratch_layers = 0.0;
  // Sets of the final norm's buffers on the last stage: its input, its
  // output (all tokens: it feeds the vocabulary-parallel head) and the
  // hidden-state gradient entering the last layer.
  double final_norm_buffer_sets = 0.0;
  // Data-parallel staging: full-size gradient buckets in flight (one
  // reducing, one filling), and 1/(dp·cp) chunks of the largest bucket that
  // ZeRO's sharded collectives stage (reduce-scatter output, all-gather input).
  double dp_bucket_buffers = 2.0;
  double zero_shard_buffers = 0.0;
  // Full-size layer gradients resident under ZeRO-2 and ZeRO-3 before their
  // reduce-scatter frees them (the reduction window). ZeRO-3 also holds two
  // gathered layers of weights (the current one and the prefetched next);
  // when its gathers queue behind the reduce-scatters on one stream, waiting
  // for a gather also retires the oldest reduce-scatter, so its window is
  // shorter.
  double zero2_unreduced_gradient_layers = 0.0;
  double zero3_unreduced_gradient_layers = 1.0;
  // Tensor-parallel staging, in token×hidden buffers: all-token ones (the
  // gathered input, a partial sum) and row ones (sharded by SP), allocated
  // under SP only or, when tp_staging_without_sp, whenever tp > 1.
  double tp_token_buffers = 2.0;
  double tp_row_buffers = 0.0;
  bool tp_staging_without_sp = false;
};

// Framework profiles. The fields above mix what the hardware does (GEMM
// efficiency, HBM-bound work, link rates and ring latencies) with what a
// training framework adds (host work per layer, fixed costs per collective
// and per pipeline send, how much communication it overlaps, how it reduces
// gradients, what it allocates). A profile is one framework's full set;
// none is per model or per cluster cell. docs/planner.md gives each value's
// source.
//
// nanotron, fitted on the Ultra-Scale Playbook runs (H100). Its fitted link
// and overhead constants absorb nanotron's implementation costs (Python,
// synchronous collectives, its pipeline engine) and are not NCCL's.
PlannerConstants NanotronConstants();

// NCCL's own costs on NVLink and InfiniBand, from published measurements
// (nccl-tests all-reduce on 2–8 A100 over NVLink; NCCL's ring latency model
// for the network step), applied to `base`.
PlannerConstants WithNcclLinks(PlannerConstants base);

// Megatron-LM as vTrain ran it (A100, fp16, no DDP gradient bucketing):
// NCCL's link costs, no TP or DP overlap, no pipeline cost beyond NCCL's,
// a reduce-scatter under the distributed optimizer. Compute, host and
// memory constants are taken from `base` (nanotron's fit: both are eager
// PyTorch frameworks on cuBLAS). Derived, not fitted: vTrain's runs stay
// held out.
PlannerConstants MegatronConstants(PlannerConstants base = NanotronConstants());

// Loom's own GPU engine (C++, NCCL through worker/comm, gradients reduced
// in buckets during backward): NCCL's link costs, DP overlapped, compute
// constants and the CUDA overhead from nanotron's fit, the memory layout read
// from the engine's code (as for the CPU engine). Not yet checked against a
// measured Loom GPU run.
PlannerConstants LoomEngineConstants(PlannerConstants base = NanotronConstants());

// What the planner uses for GPU jobs: Loom's engine profile.
PlannerConstants DefaultConstants();

// Loom's own CPU engine (fp32, OpenBLAS, tiled attention that keeps the
// log-sum-exp, not the scores): the GPU engine's memory layout without the
// CUDA overhead, checked against the peaks its MemoryTracker measures per layout
// (tools/planner/data/engine_memory.csv, tests/planner/engine_memory_test.cc).
PlannerConstants CpuEngineConstants();

// The profile `loomctl plan --profile=NAME` names: "loom" (Loom's engine:
// CpuEngineConstants for CPU jobs, DefaultConstants for GPU jobs),
// "nanotron" or "megatron" (GPU frameworks: INVALID_ARGUMENT for a CPU job).
// An unknown name is INVALID_ARGUMENT listing the known ones.
absl::StatusOr<PlannerConstants> ConstantsForProfile(std::string_view profile, bool cpu_job);

}  // namespace loom::planner
