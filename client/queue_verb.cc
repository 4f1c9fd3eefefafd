#include "client/queue_verb.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/rpc/rpc_settings.h"

namespace loom::client {
namespace {

std::string Waited(int64_t created_unix_ms, int64_t now_unix_ms) {
  const int64_t s = std::max<int64_t>(0, (now_unix_ms - created_unix_ms) / 1000);
  if (s < 120) return absl::StrCat(s, "s");
  if (s < 7200) return absl::StrCat(s / 60, "m");
  return absl::StrCat(s / 3600, "h", (s % 3600) / 60, "m");
}

}  // namespace

std::string FormatQueue(const loom::v1::ListQueueResponse& queue, int64_t now_unix_ms) {
  if (queue.jobs().empty()) {
    return queue.total() == 0
               ? std::string("no job waits\n")
               : absl::StrCat("none of your jobs waits (", queue.total(), " waiting in all)\n");
  }
  std::string out = absl::StrFormat("%-4s %-24s %-12s %8s %-10s %7s  %s\n", "POS", "JOB", "OWNER",
                                    "PRIORITY", "DEVICES", "WAITED", "WHY");
  for (const loom::v1::QueuedJob& j : queue.jobs()) {
    std::string why = j.reason();
    if (j.action() != "wait") why = absl::StrCat(j.action(), " now: ", why);
    absl::StrAppend(&out, absl::StrFormat("%-4d %-24s %-12s %8d %-10s %7s  %s\n", j.position(),
                                          j.id(), j.owner(), j.priority(),
                                          absl::StrCat(j.devices(), " ", j.device_kind()),
                                          Waited(j.created_unix_ms(), now_unix_ms), why));
  }
  if (queue.total() > queue.jobs_size()) {
    absl::StrAppend(&out, queue.total(), " waiting in all\n");
  }
  return out;
}

int RunQueue(loom::v1::JobService::StubInterface& stub,
             const std::function<int(const grpc::Status&)>& fail) {
  loom::v1::ListQueueResponse response;
  auto context = loom::rpc::UnaryContext();
  grpc::Status status = stub.ListQueue(context.get(), {}, &response);
  if (!status.ok()) return fail(status);
  std::printf("%s", FormatQueue(response, absl::ToUnixMillis(absl::Now())).c_str());
  return 0;
}

}  // namespace loom::client
