// Elastic jobs' sizing decisions (docs/fault_tolerance.md, "Elastic jobs"):
// after a job lost devices and no spare or free device takes its ranks, to how
// many ranks it shrinks (or that it waits, and why); when devices return, to
// how many it grows back, and not before the spec's minimum time between
// resizes. Pure: the sizes come from the planner's re-plan
// (planner::ReplanOnRanks: every axis searched again, the global batch kept,
// the engine's rules and memory), the devices and times from the caller; the
// lifecycle carries the answer out and records it in the job's history.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/spec/job_spec.h"
#include "loom/v1/job.pb.h"

namespace loom::coordinator {

enum class ElasticAction {
  kKeep,    // nothing to do: the job runs at the size it should
  kResize,  // re-plan onto `ranks` (smaller: shrink; larger: grow back)
  kWait,    // too few devices to run at any size it may take: wait for more
};

struct ElasticDecision {
  ElasticAction action = ElasticAction::kKeep;
  int64_t ranks = 0;  // the size to run at (kResize), or the size it runs at
  // kResize: the job's spec re-planned onto `ranks` (resources and layout
  // rewritten; model, data, precision and global batch as requested).
  spec::JobSpec spec;
  // One sentence for the job's history: from which layout to which and why,
  // or why it waits (naming fault_tolerance.min_ranks), or why it keeps.
  std::string reason;
};

// A job that lost devices and has no spare: the largest size from the
// devices it can hold now (`available_ranks`: its surviving ranks' plus free
// ones) down to fault_tolerance.min_ranks that the planner can lay the job
// out on. `requested` is the job as submitted and resolved (its full size),
// `current` the spec it ran under when it failed. With min_ranks 0 (the
// default) the job never shrinks: it waits for placement at full size.
ElasticDecision DecideShrink(const spec::JobSpec& requested, const spec::JobSpec& current,
                             int64_t available_ranks, const std::string& why);

// A job running below its requested size: grow back to the largest size the
// available devices (its own ranks' plus free ones) allow, up to the
// requested one, once fault_tolerance.min_resize_interval_s has passed since
// its last resize (`last_resize`; InfinitePast when none). kKeep otherwise,
// with the reason (already at full size, no more devices, too soon).
ElasticDecision DecideGrow(const spec::JobSpec& requested, const spec::JobSpec& current,
                           int64_t available_ranks, absl::Time now, absl::Time last_resize);

// The job at the size it asked for: `spec_yaml` (as submitted) resolved as
// at admission (deterministic: the same layout), over `current`, the spec it
// runs under now (what admission filled in stays). `current` itself when the
// sizes agree.
absl::StatusOr<spec::JobSpec> RequestedSpec(const std::string& spec_yaml,
                                            const spec::JobSpec& current);

// How the history line of a job stopped to grow back begins.
inline constexpr char kStopsToGrowBack[] = "stops to grow back to ";

// When the job was last resized or stopped to grow back (the newest history
// event the lifecycle recorded for one): a grow-back that could not be placed
// waits the minimum interval like a resize. InfinitePast when never.
absl::Time LastResize(const loom::v1::Job& job);

// "dp=4 tp=1 pp=1 ... (4 ranks)": how the history names a layout.
std::string DescribeSize(const spec::JobSpec& spec);

}  // namespace loom::coordinator
