// `loomctl trace`'s file (docs/observability.md, "Traces"): the ranks'
// recorded steps (RankProgress.trace) as one Chrome trace-event JSON, the
// format ui.perfetto.dev and chrome://tracing open. Pure: no locks, no I/O.
//
// A process per rank (pid = rank + 1, named "rank 2 TP(0)-PP(1)-DP(0) on
// node-a"), a thread per track ("compute" first, then one per communicator
// group), complete events ("ph":"X") in microseconds. The ranks' clocks are
// aligned by their wall clocks: each trace carries the rank's wall-clock time
// at the step's start, and every timestamp is taken relative to the earliest
// of them (hosts must keep their clocks in step, e.g. NTP; ranks of one host
// share one clock).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/v1/rank.pb.h"

namespace loom::coordinator {

struct RankTrace {
  int rank = 0;
  std::string place;  // TP(0)-CP(0)-PP(1)-DP(0)-Rank(2)
  std::string node_id;
  loom::v1::StepTrace trace;
  // The same step's timing summary from the same report (the communicators'
  // own count of their calls): the file carries it in otherData.ranks, so a
  // reader can check that the trace holds every collective.
  loom::v1::StepTiming timing;
};

struct TraceFileInfo {
  std::string job_id;
  int64_t step = 0;
  std::vector<int> missing_ranks;  // asked, no trace came
};

// The JSON document. Events naming a track or name the trace does not hold
// are skipped and counted with the dropped ones; a rank that dropped events
// gets an instant event "N events dropped" at its step's end.
std::string ChromeTraceJson(const TraceFileInfo& info, const std::vector<RankTrace>& ranks);

}  // namespace loom::coordinator
