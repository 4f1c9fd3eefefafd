// `loomctl trace` at the coordinator (docs/observability.md, "Traces"): one
// TraceJob call becomes a TraceStep to each node that runs asked-for ranks
// (on its agent session; the agent passes it to the ranks' control streams),
// and the ranks' traces, which come back inside their step reports
// (RankProgress.trace, through the node service), become one Chrome
// trace-event JSON (trace_assembly.h) for the caller.
//
// No gRPC thread waits: the handler only starts a request (Start), a node
// session's reaction only stores the trace it read (Deliver); the relay's own
// thread assembles the file and answers, once every rank's trace is in or
// the request's deadline passed (then with the ranks that are missing).
// Bounded: max_per_job requests per job and max_requests in all at once.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/service/trace_assembly.h"
#include "loom/v1/job.pb.h"
#include "loom/v1/node.pb.h"

namespace loom::coordinator {

inline constexpr int kMaxTraceRanks = 64;  // per request: the file stays under 16 MiB
inline constexpr int kDefaultTraceWaitSeconds = 60;
inline constexpr int kMaxTraceWaitSeconds = 600;
// The default step: the newest reported + kTraceStepsAhead, or more for short
// steps, so that the request reaches the ranks (about kTraceLeadSeconds) first.
inline constexpr int64_t kTraceStepsAhead = 3;
inline constexpr double kTraceLeadSeconds = 1.0;

// One rank to trace and where it runs.
struct TraceTarget {
  int rank = 0;
  std::string node_id;
  std::string place;
};

struct TraceSpec {
  std::string job_id;
  int attempt = 0;
  int64_t step = 0;
  std::vector<TraceTarget> ranks;  // ascending
  absl::Duration wait = absl::Seconds(kDefaultTraceWaitSeconds);
};

// The request on `job` (its full view, with the placement), or why not:
// FAILED_PRECONDITION for a job that does not run now, INVALID_ARGUMENT
// naming `step` (already begun, or past train.steps), `ranks` (not a rank of
// the job, more than kMaxTraceRanks) or `wait_seconds`.
absl::StatusOr<TraceSpec> TraceSpecFor(const loom::v1::Job& job,
                                       const loom::v1::TraceJobRequest& request);

struct TraceRelayOptions {
  int max_per_job = 2;
  int max_requests = 16;
};

class TraceRelay {
 public:
  using Send = std::function<bool(const std::string& node_id, const loom::v1::CoordinatorMessage&)>;
  using Done = std::function<void(absl::StatusOr<loom::v1::TraceJobResponse>)>;

  explicit TraceRelay(Send send, TraceRelayOptions options = {});
  ~TraceRelay();  // answers what is pending with UNAVAILABLE

  // Sends the TraceStep to the ranks' nodes; `done` is called once, from the
  // relay's thread. RESOURCE_EXHAUSTED (done not called) when the job or the
  // relay has as many requests as allowed.
  absl::Status Start(TraceSpec spec, Done done);
  // A report read from node `node_id`'s session; only one with a trace that
  // a pending request asked of that node counts. Never blocks for long.
  void Deliver(const std::string& node_id, const loom::v1::RankProgress& report);

  size_t pending() const;

 private:
  struct Request {
    TraceSpec spec;
    Done done;
    absl::Time deadline;
    std::map<int, RankTrace> received;  // by rank
  };
  void Run();
  // Builds the answer of a request that is complete or past its deadline.
  static loom::v1::TraceJobResponse Answer(const Request& request);

  const Send send_;
  const TraceRelayOptions options_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  int64_t next_id_ = 1;
  std::map<int64_t, Request> requests_;
  bool stopping_ = false;
  std::thread thread_;  // last: started once the members it uses exist
};

}  // namespace loom::coordinator
