// loomctl logs: a rank's log lines, streamed from its node's agent through
// the coordinator (JobService.StreamLogs; docs/client.md).
#include <chrono>
#include <cstdio>

#include "absl/flags/flag.h"
#include "client/loomctl_context.h"
#include "client/loomctl_verbs.h"
#include "common/cli/parse_flags.h"

ABSL_FLAG(int32_t, rank, 0, "logs: the rank whose log to show");
ABSL_FLAG(bool, all, false, "logs: every rank's log, each line prefixed with [rank N]");
ABSL_FLAG(bool, follow, false, "logs: keep streaming new lines until the rank (or every rank) ends");
ABSL_FLAG(int32_t, tail, 0, "logs: start with the last N lines (0: from the beginning)");
ABSL_FLAG(int32_t, attempt, 0, "logs: the attempt (0: the job's current or last one)");

namespace loom::client {

int RunLogs(const Args& args) {
  if (absl::GetFlag(FLAGS_tail) < 0) loom::cli::UsageError("--tail must not be negative");
  if (absl::GetFlag(FLAGS_attempt) < 0) loom::cli::UsageError("--attempt must not be negative");
  loom::v1::StreamLogsRequest request;
  request.set_id(args[1]);
  request.set_rank(absl::GetFlag(FLAGS_rank));
  request.set_all_ranks(absl::GetFlag(FLAGS_all));
  request.set_follow(absl::GetFlag(FLAGS_follow));
  request.set_tail_lines(absl::GetFlag(FLAGS_tail));
  request.set_attempt(absl::GetFlag(FLAGS_attempt));
  grpc::ClientContext context;
  if (!request.follow()) {
    // A whole log is bounded; only a follower waits for as long as ranks run.
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(10));
  }
  auto reader = Stub()->StreamLogs(&context, request);
  loom::v1::StreamLogsResponse response;
  while (reader->Read(&response)) {
    for (const std::string& line : response.lines()) {
      std::fwrite(line.data(), 1, line.size(), stdout);
      std::fputc('\n', stdout);
    }
    std::fflush(stdout);
  }
  grpc::Status status = reader->Finish();
  if (!status.ok()) return RpcFail(status);
  return 0;
}

}  // namespace loom::client
