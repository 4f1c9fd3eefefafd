// How a rank that stopped gracefully (docs/scheduling.md, "Preemption") says
// so through its attempt loop to its exit code: a status carrying a payload,
// so that neither the in-place path (which treats ABORTED as a failed
// attempt) nor the exit code table mistakes it for a failure.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace loom::trainer {

inline constexpr char kStoppedPayload[] = "type.loom.dev/stopped";

inline absl::Status StoppedStatus(int64_t step, const std::string& why) {
  absl::Status s = absl::AbortedError(
      absl::StrCat("stopped gracefully after step ", step, " (", why, ")"));
  s.SetPayload(kStoppedPayload, absl::Cord(absl::StrCat(step)));
  return s;
}

inline bool IsStopped(const absl::Status& status) {
  return status.GetPayload(kStoppedPayload).has_value();
}

}  // namespace loom::trainer
