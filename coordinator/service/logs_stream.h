// StreamLogs' two halves, kept out of job_service.cc: which nodes to ask for
// which ranks (pure, from the job and the request), and the gRPC write
// reactor that a LogRelay stream writes to.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/service/log_relay.h"
#include "grpcpp/grpcpp.h"
#include "loom/v1/job.pb.h"

namespace loom::coordinator {

// The stream for `request` on `job` (its full view, with the placement).
// The current attempt's ranks are asked of the node they were placed on; an
// earlier attempt's (whose placement is not kept) of the current placement's
// nodes, the rank's own first, then `other_nodes`. Errors name what is
// missing: the attempt, the rank, a job not placed yet.
absl::StatusOr<LogStreamSpec> LogStreamSpecFor(const loom::v1::Job& job,
                                               const loom::v1::StreamLogsRequest& request,
                                               const std::vector<std::string>& other_nodes);

// A reactor that ends at once with `refusal`, or streams `spec` through the
// relay until it ends or the caller goes away.
grpc::ServerWriteReactor<loom::v1::StreamLogsResponse>* StartLogStream(
    LogRelay* relay, absl::StatusOr<LogStreamSpec> spec);

}  // namespace loom::coordinator
