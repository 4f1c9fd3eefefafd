#include "worker/comm/gloo_errors.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace loom::comm {

std::string StripGlooLocation(const std::string& what) {
  if (!what.empty() && what[0] == '[') {
    const size_t end = what.find("] ");
    if (end != std::string::npos) return what.substr(end + 2);
  }
  return what;
}

absl::Status GlooFailureToStatus(const std::string& group, const std::string& op, GlooFailureKind kind,
                                 const std::string& what, absl::Duration timeout) {
  const std::string detail = StripGlooLocation(what);
  const std::string head = absl::StrCat("group ", group, ": ", op);
  if (kind == GlooFailureKind::kIo) {
    if (absl::StrContains(detail, "Application timeout")) {
      // Another operation of this rank timed out and closed every connection.
      return absl::DeadlineExceededError(absl::StrCat(
          head, " failed: another operation of this communicator timed out after ",
          absl::FormatDuration(timeout), " waiting for peers and closed its connections"));
    }
    if (absl::StrContains(detail, "Timed out") || absl::StrContains(detail, "timeout")) {
      return absl::DeadlineExceededError(absl::StrCat(
          head, " timed out after ", absl::FormatDuration(timeout), " waiting for peers (", detail, ")"));
    }
    return absl::UnavailableError(absl::StrCat(
        head, " failed: lost the connection to a peer (it exited, or failed and closed its side): ",
        detail));
  }
  return absl::InternalError(absl::StrCat(
      head, " failed inside Gloo (do all ranks call the same collectives with the same sizes?): ", detail));
}

}  // namespace loom::comm
