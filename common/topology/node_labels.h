// Node labels: key=value pairs an agent declares about where its node sits in
// the network (loom-worker --labels=rack=r1,nvlink_domain=d0), sent at
// registration (RegisterNode.labels) and read by placement (placement.h):
//   rack           nodes of one rack; a job's ranks are kept in as few racks
//                  as hold it, and in rank order rack by rack.
//   nvlink_domain  nodes joined by NVLink/NVSwitch; they may together hold
//                  one TP group.
// Other keys are carried and shown (`loomctl nodes`) but placement ignores
// them. Pure logic, no I/O.
#pragma once

#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loom::topology {

inline constexpr char kRackLabel[] = "rack";
inline constexpr char kNvlinkDomainLabel[] = "nvlink_domain";
// Labels are kept per node in memory and in every `loomctl nodes` row.
inline constexpr int kMaxNodeLabels = 16;
inline constexpr size_t kMaxLabelBytes = 63;

using NodeLabels = std::map<std::string, std::string>;

// "key=value,key=value" (empty: no labels). A key is 1-63 characters of
// lowercase letters, digits, '_', '-' and '.', starting with a letter; a
// value 1-63 characters of letters, digits, '_', '-' and '.'; a key at most
// once; at most 16 labels. Errors (INVALID_ARGUMENT) name `what` (the flag,
// e.g. "--labels") and the rule.
absl::StatusOr<NodeLabels> ParseNodeLabels(absl::string_view text, absl::string_view what);

// The same rules for labels that arrived already split (a registration from
// the network); errors name `what` (e.g. "register.labels") and never echo
// the offending bytes.
absl::Status CheckNodeLabels(const NodeLabels& labels, absl::string_view what);

// "rack=r1,nvlink_domain=d0" in key order; "" for none.
std::string FormatNodeLabels(const NodeLabels& labels);

}  // namespace loom::topology
