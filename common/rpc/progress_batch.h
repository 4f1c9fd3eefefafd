// The most progress reports one NodeMessage.progress may carry: the agent
// fills its batches up to it (worker/agent/node_session.h) and the coordinator
// ends a session that sends more (coordinator/cluster/node_limits.h). A wire
// contract, so one number for both.
#pragma once

namespace loom::rpc {

inline constexpr int kMaxProgressBatchReports = 1024;

}  // namespace loom::rpc
