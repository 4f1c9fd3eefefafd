#include "worker/trainer/commit_gate.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/rpc/commit_gate.h"

namespace loom::trainer {

engine::CommitGate MakeStoreCommitGate(comm::Store* store, CommitGateOptions options,
                                       std::function<void(const std::string&)> on_event) {
  return [store, options, on_event = std::move(on_event)](int64_t step) -> absl::Status {
    const std::string key = rpc::CommitKey(step);
    const absl::Time give_up = absl::Now() + options.retry_for;
    absl::Duration backoff = options.first_backoff;
    int tries = 0;
    while (true) {
      ++tries;
      absl::StatusOr<int64_t> added = store->Add(key, 1);
      if (added.ok()) return absl::OkStatus();
      const absl::Status& s = added.status();
      const bool transient = absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s);
      if (!transient) {
        return absl::Status(s.code(), absl::StrCat("commit gate ", key, ": ", s.message()));
      }
      if (absl::Now() + backoff > give_up) {
        const std::string why =
            absl::StrCat("checkpoint of step ", step, " skipped: the commit gate ", key,
                         " stayed unavailable for ", absl::FormatDuration(options.retry_for), " (",
                         tries, " tries): ", s.message());
        if (on_event) on_event(why);
        return absl::UnavailableError(why);
      }
      absl::SleepFor(backoff);
      backoff = std::min(backoff * 2, options.max_backoff);
    }
  };
}

}  // namespace loom::trainer
