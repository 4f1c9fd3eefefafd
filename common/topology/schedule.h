// Pipeline schedules: each stage's instruction list for one optimizer step.
//
//  - AFAB (GPipe): all forwards, then all backwards (in micro-batch order).
//  - 1F1B: stage s runs min(pp-s-1, m) warm-up forwards, then alternates one
//    forward and one backward, then drains the remaining backwards. At most
//    pp-s micro-batches' activations are stashed on stage s.
//  - Interleaved 1F1B with v virtual stages (Megatron's order): each stage holds
//    v model chunks (chunk c = virtual stage c*pp + s); micro-batches advance in
//    groups of pp through chunk 0, then chunk 1, ...; warm-up is
//    min((pp-s-1)*2 + (v-1)*pp, m*v) forwards. Rule: m must be a multiple of pp
//    (Megatron's requirement, so every group of pp micro-batches is whole).
//    With v = 1 it is 1F1B.
//
// The order of forwards and backwards comes from the schedule; sends and
// receives are then placed by running the stages in time (forward 1, backward 2
// per chunk) and recording each transfer at the moment both ends are free:
// every send right after the compute that produced it, and a receive whenever
// the stage is idle (possibly before it is needed). Because the lists are the
// projection of one complete execution in which each send meets its receive,
// they never deadlock under blocking (rendezvous) send/recv, whatever the real
// timings; with buffered sends they cannot deadlock either. Each list ends with
// ReduceGradients, OptimizerStep. Pure logic, no I/O.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "common/topology/instruction.h"

namespace loom::topology {

// The job spec's schedule enum (spec::ScheduleName spells it).
using ScheduleKind = spec::Schedule;

struct ScheduleRequest {
  ScheduleKind kind = ScheduleKind::k1F1B;
  int64_t pp = 1;
  int64_t virtual_stages = 1;  // > 1 only with kInterleaved
  int64_t microbatches = 1;    // per optimizer step, per data-parallel rank
};

struct PipelineSchedule {
  ScheduleKind kind = ScheduleKind::k1F1B;
  int64_t pp = 1;
  int64_t virtual_stages = 1;
  int64_t microbatches = 1;
  std::vector<std::vector<Instruction>> stages;  // index = pipeline stage
};

// INVALID_ARGUMENT names the field and rule: pp, microbatches, virtual_stages
// >= 1; virtual_stages > 1 needs kInterleaved; kInterleaved needs microbatches
// divisible by pp.
absl::Status ValidateScheduleRequest(const ScheduleRequest& request);

// Forwards and backwards only, per stage, in execution order.
absl::StatusOr<std::vector<std::vector<Instruction>>> ComputeOrder(const ScheduleRequest& request);

// Full instruction lists (compute, transfers, ReduceGradients, OptimizerStep).
absl::StatusOr<PipelineSchedule> BuildSchedule(const ScheduleRequest& request);

// Bubble time over ideal compute time with uniform chunk costs and free
// transfers: (pp-1)/m for AFAB and 1F1B, (pp-1)/(v*m) for interleaved.
double AnalyticBubbleFraction(const ScheduleRequest& request);

// Most micro-batch activations stashed at once (forwards minus backwards so
// far, counted per (micro-batch, chunk)), from the list's order alone.
int64_t PeakActivations(const std::vector<Instruction>& instructions);

}  // namespace loom::topology
