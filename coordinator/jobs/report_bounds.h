// What a rank's progress report may hold, derived from its job (docs/limits.md,
// "Rank reports"): a rank is not trusted (a trainer reading hostile data, or a
// compromised process), so every repeated field and every string of its
// report is bounded by what the job's spec allows before anything of it is
// stored, turned into metric series or shown to watchers. Pure: no locks, no
// I/O; the progress path calls it once per report and ignores a report it
// refuses (counted like a report of a rank the node does not run).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "common/rpc/progress_batch.h"
#include "common/spec/job_spec.h"
#include "loom/v1/rank.pb.h"

namespace loom::coordinator {

// Fixed bounds, far above what the trainer sends, for what the spec does not
// size.
inline constexpr int64_t kMaxReportBytes = rpc::kMaxProgressReportBytes;  // one encoded report
inline constexpr int kMaxReportPhaseBytes = 32;          // "checkpoint", "aborted" ...
inline constexpr int kMaxReportGroups = 16;              // one per axis and combination
inline constexpr int kMaxReportGroupNameBytes = 256;     // group_factory lists 4 members at most
inline constexpr int kMaxReportOpBytes = 64;             // "allreduce", "send" ...
inline constexpr int kMaxReportSnapshotSteps = 16;       // three generations are kept
// `loomctl trace`'s step (RankProgress.trace): the trainer's own caps
// (worker/trainer/step_trace.h); the report's byte bound holds it as a whole.
inline constexpr int kMaxReportTraceEvents = 1024;
inline constexpr int kMaxReportTraceTracks = 16;
inline constexpr int kMaxReportTraceNames = 64;

// OK, or INVALID_ARGUMENT naming the first field beyond its bound and the
// bound (never quoting the value). `world` is the job's placed rank count.
absl::Status CheckReportBounds(const spec::JobSpec& spec, int64_t world,
                               const loom::v1::RankProgress& report);

// The part of it for report.trace (OK without one), for the trace relay,
// which reads the traces off the progress path (no spec needed).
absl::Status CheckReportTrace(const loom::v1::RankProgress& report);

}  // namespace loom::coordinator
