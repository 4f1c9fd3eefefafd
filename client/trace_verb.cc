// loomctl trace: one step recorded on every (or the listed) rank of a running
// job, written as one Chrome trace-event JSON file (JobService.TraceJob;
// docs/observability.md, "Traces").
#include <chrono>
#include <cstdio>
#include <fstream>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/loomctl_context.h"
#include "client/loomctl_verbs.h"
#include "common/cli/parse_flags.h"
#include "common/rank_list.h"

ABSL_FLAG(std::string, step, "next",
          "trace: the step to record, one not begun yet (next: a few steps after the newest "
          "reported)");
ABSL_FLAG(std::string, output, "", "trace: the file to write the trace-event JSON to");
ABSL_FLAG(std::string, ranks, "", "trace: the ranks to record, like 0,2-3 (default: every rank)");
ABSL_FLAG(int32_t, wait_s, 60, "trace: how long the coordinator waits for the ranks' traces");

namespace loom::client {

int RunTrace(const Args& args) {
  const std::string output = absl::GetFlag(FLAGS_output);
  if (output.empty()) loom::cli::UsageError("trace needs --output=FILE");
  loom::v1::TraceJobRequest request;
  request.set_id(args[1]);
  const std::string step = absl::GetFlag(FLAGS_step);
  if (step != "next") {
    int64_t n = 0;
    if (!absl::SimpleAtoi(step, &n) || n <= 0) {
      loom::cli::UsageError("--step must be a positive step number or 'next'");
    }
    request.set_step(n);
  }
  if (const std::string ranks = absl::GetFlag(FLAGS_ranks); !ranks.empty()) {
    absl::StatusOr<std::vector<int>> list = loom::ParseRankList(ranks, 1 << 16);
    if (!list.ok()) loom::cli::UsageError(absl::StrCat("--ranks: ", list.status().message()));
    for (int r : *list) request.add_ranks(r);
  }
  const int32_t wait = absl::GetFlag(FLAGS_wait_s);
  if (wait <= 0 || wait > 600) loom::cli::UsageError("--wait_s must be in [1, 600]");
  request.set_wait_seconds(wait);
  grpc::ClientContext context;
  // The coordinator answers by its own deadline; this one only covers a
  // coordinator that never does.
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(wait + 30));
  loom::v1::TraceJobResponse response;
  grpc::Status status = Stub()->TraceJob(&context, request, &response);
  if (!status.ok()) return RpcFail(status);
  if (response.ranks().empty()) {
    return Fail(absl::StrCat("no rank sent its trace of step ", response.step(), " within ", wait,
                             " s (was the step already under way, or did the job end?)"));
  }
  std::ofstream out(output, std::ios::binary | std::ios::trunc);
  out << response.trace_json();
  out.close();
  if (!out) return Fail(absl::StrCat("cannot write ", output));
  std::printf("wrote %s: step %lld of %d ranks", output.c_str(),
              static_cast<long long>(response.step()), response.ranks_size());
  if (response.dropped_events() > 0) {
    std::printf(", %lld events dropped over the per-rank cap",
                static_cast<long long>(response.dropped_events()));
  }
  std::printf("; open it in ui.perfetto.dev or chrome://tracing\n");
  if (!response.missing_ranks().empty()) {
    std::vector<int64_t> missing(response.missing_ranks().begin(), response.missing_ranks().end());
    return Fail(absl::StrCat("ranks ", loom::RankList(missing), " sent no trace within ", wait,
                             " s; the file holds the others"));
  }
  return 0;
}

}  // namespace loom::client
