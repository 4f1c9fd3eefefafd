// loomctl queue: the waiting jobs in the order the scheduler will place them,
// with why each waits (docs/scheduling.md). A user sees their own jobs at
// their place in the whole queue; an admin sees every job.
#pragma once

#include <functional>
#include <string>

#include "grpcpp/grpcpp.h"
#include "loom/v1/job.grpc.pb.h"

namespace loom::client {

// The table loomctl queue prints (pure).
std::string FormatQueue(const loom::v1::ListQueueResponse& queue, int64_t now_unix_ms);

// Asks the coordinator and prints the table; an RPC error goes to fail.
int RunQueue(loom::v1::JobService::StubInterface& stub,
             const std::function<int(const grpc::Status&)>& fail);

}  // namespace loom::client
