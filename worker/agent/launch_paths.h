// The agent's own check of where a rank may read and write, made at launch
// with this node's roots (--data_roots, --checkpoint_root) whatever the
// coordinator sent: data paths are resolved with their symlinks and must stay
// beneath a data root; the checkpoint directory is recomputed as
// <checkpoint_root>/<owner>/<job_id> and created without following symlinks.
// The assignment is rewritten with the results before the trainer sees it.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/confine/path_resolve.h"
#include "loom/v1/rank.pb.h"

namespace loom::agent {

struct LaunchRoots {
  std::vector<std::string> data_roots;  // absolute, normalised; at least one
  std::string checkpoint_root;          // absolute, normalised
  confine::FileOwner rank_owner;        // who the job's checkpoint directory belongs to
  mode_t checkpoint_mode = 0700;        // of the job's checkpoint directory when made
};

// Any error means the job cannot run as sent (the rank is reported with the
// job-broken exit code); messages name fields and rules, never file bytes.
absl::Status ConfineAssignment(loom::v1::RankAssignment& assignment, const LaunchRoots& roots);

}  // namespace loom::agent
