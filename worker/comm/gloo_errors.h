// Turns what Gloo throws into the statuses the engine sees: the group and the
// operation named, the rule or cause in words. Internal to the Gloo
// communicator; pure, so the wording is unit-tested.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace loom::comm {

enum class GlooFailureKind {
  kIo,     // gloo::IoException: a timeout, a closed or reset connection
  kOther,  // any other gloo::Exception or failed Gloo assertion
};

// DEADLINE_EXCEEDED for Gloo's own timeouts ("group dp: all_reduce timed out
// after 5s waiting for peers"), UNAVAILABLE for a lost connection, INTERNAL
// for the rest (for instance ranks calling different collectives).
absl::Status GlooFailureToStatus(const std::string& group, const std::string& op, GlooFailureKind kind,
                                 const std::string& what, absl::Duration timeout);

// Gloo's messages start with "[/path/to/file.cc:123] "; the location means
// nothing to a user, so it is dropped.
std::string StripGlooLocation(const std::string& what);

}  // namespace loom::comm
