// Pipeline simulator: executes every stage's instruction list together with
// point-to-point semantics and per-instruction costs, and reports whether the
// lists deadlock, the makespan, the bubble fraction and the peak number of
// stashed activations per stage. Pure logic, no I/O: it is how the schedules
// are tested and how their bubbles are reported.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/topology/instruction.h"
#include "common/topology/schedule.h"

namespace loom::topology {

struct SimCosts {
  double forward = 1.0;   // per chunk
  double backward = 2.0;  // per chunk
  double transfer = 0.0;  // per send/recv pair
  double reduce_gradients = 0.0;
  double optimizer_step = 0.0;
};

enum class SendMode {
  kRendezvous,  // a send completes only when its receiver is at the matching
                // receive (the strictest reading of a blocking send)
  kBuffered,    // a send completes at once; the receive waits for the data
};

struct SimOptions {
  SimCosts costs;
  SendMode send_mode = SendMode::kRendezvous;
};

struct StageReport {
  double busy = 0;    // compute time (forward + backward + reduce + step)
  double finish = 0;  // when the stage's last instruction completed
  int64_t peak_activations = 0;
};

struct SimReport {
  bool deadlocked = false;
  std::string deadlock;   // where each unfinished stage is blocked
  double makespan = 0;    // latest finish
  // (makespan - busiest stage's compute time) / that compute time: the idle
  // share that the pipeline adds on top of the ideal step.
  double bubble_fraction = 0;
  std::vector<StageReport> stages;
};

// Runs lists for pp = stages.size() stages with the given chunks per stage and
// micro-batches. A malformed list is an error, not a deadlock
// (FAILED_PRECONDITION naming the stage, the instruction and the rule): a peer
// out of range, a send matched with a receive of another micro-batch, chunk or
// kind, a compute before its input arrived, a send before its data exists, a
// forward or backward missing or repeated, ReduceGradients before the last
// backward or OptimizerStep before ReduceGradients.
absl::StatusOr<SimReport> SimulateStages(const std::vector<std::vector<Instruction>>& stages,
                                         int64_t virtual_stages, int64_t microbatches,
                                         const SimOptions& options = {});

absl::StatusOr<SimReport> Simulate(const PipelineSchedule& schedule,
                                   const SimOptions& options = {});

}  // namespace loom::topology
