// Memory per rank of a layout: parameters, gradients and optimizer states by
// precision recipe and ZeRO stage; activations per layer per micro-batch
// (Korthikanti et al. 2022, table 2, adapted to SwiGLU, GQA and fused
// attention) times the micro-batches a schedule keeps in flight; embedding,
// LM head and logits on the stages that hold them; ZeRO-3's gathered blocks;
// communication buffers; a fixed overhead; in-place recovery's snapshot
// copies (in host memory, which is a CPU rank's device memory). The peak is
// that of the worst pipeline stage (the first holds the most micro-batches,
// the last the logits).
#pragma once

#include <cstdint>

#include "planner/cluster.h"
#include "planner/constants.h"
#include "planner/layout.h"

namespace loom::planner {

struct MemoryBreakdown {
  double weights = 0;
  double gradients = 0;        // including the fp32 accumulation buffer
  double optimizer = 0;        // master copy and Adam moments
  double activations = 0;      // saved for backward, all micro-batches in flight
  double logits = 0;           // the loss's working set on the last stage
  double zero3_gathered = 0;   // unsharded blocks ZeRO-3 holds while computing
  double comm_buffers = 0;
  double overhead = 0;
  // [in-place recovery] The rank's snapshot copies: Workload::snapshot_copies
  // times the state it holds (its weights and optimizer states, ZeRO's
  // ranges of them: what a snapshot holds). Host memory: on a CPU rank its
  // device itself (in total()); on a GPU rank beside the device (host_bytes()),
  // the most any rank of the layout holds, whatever its stage.
  double snapshots = 0;
  bool snapshots_on_device = false;
  int64_t stage = 0;           // which pipeline stage this is (the worst one)
  int64_t micro_batches_in_flight = 0;

  // What the rank needs of its device.
  double total() const {
    return weights + gradients + optimizer + activations + logits + zero3_gathered +
           comm_buffers + overhead + (snapshots_on_device ? snapshots : 0);
  }
  // What the rank needs of its node's host memory beyond that (GPU ranks).
  double host_bytes() const { return snapshots_on_device ? 0 : snapshots; }
};

// Bytes of activations one layer saves for one micro-batch on one rank.
double ActivationBytesPerLayer(const Workload& workload, const Layout& layout,
                               const PlannerConstants& constants);

// Micro-batches whose activations a stage holds at its peak.
double MicroBatchesInFlight(const Layout& layout, int64_t stage);

// [moe] Routed-expert parameters per layer on one rank: the model's experts
// averaged over its layers, split over ep x tp (0 for a dense model).
double ExpertParamsPerLayer(const Workload& w, const Layout& l);

// Layers on pipeline stage `stage` (the first stages take the remainder).
int64_t LayersOnStage(int64_t num_layers, int64_t pp, int64_t stage);

// Parameters one rank holds before ZeRO sharding, on its largest stage.
double MaxParamsPerRank(const Workload& workload, const Layout& layout);

// The peak of one rank: the larger of the first and last pipeline stage's.
MemoryBreakdown EstimateMemory(const Workload& workload, const Layout& layout,
                               const PlannerConstants& constants);
// One stage's (0 .. pp-1), e.g. to hold the stage fixed while constants vary.
MemoryBreakdown EstimateStageMemory(const Workload& workload, const Layout& layout,
                                    const PlannerConstants& constants, int64_t stage);

}  // namespace loom::planner
