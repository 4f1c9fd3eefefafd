// The most progress reports one NodeMessage.progress may carry: the agent
// fills its batches up to it (worker/agent/node_session.h) and the coordinator
// ends a session that sends more (coordinator/cluster/node_limits.h). A wire
// contract, so one number for both. Likewise the bytes: one report (the
// agent refuses a bigger one on its socket and the coordinator ignores it,
// coordinator/jobs/report_bounds.h) and one batch, far below the transport's
// 16 MiB, so that a rank's reports can never make its node's session fail.
#pragma once

#include <cstdint>

namespace loom::rpc {

inline constexpr int kMaxProgressBatchReports = 1024;
inline constexpr int64_t kMaxProgressReportBytes = 64 * 1024;
inline constexpr int64_t kMaxProgressBatchBytes = int64_t{4} << 20;

}  // namespace loom::rpc
