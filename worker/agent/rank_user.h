// Who a rank runs as, decided at launch from the agent's flags and the
// assignment: with --run_as_uid_range, the job's own uid and gid
// (RankAssignment.run_uid, the same number for both), checked against this
// node's range, plus the resume_from job's group so that its checkpoints can
// be read; with --run_as_user, that one user for every job; otherwise the
// agent's own user. Pure: nothing is switched or created here
// (process_supervisor.h and launch_paths.h do that).
#pragma once

#include <sys/types.h>

#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "common/confine/path_resolve.h"
#include "common/confine/uid_range.h"
#include "loom/v1/rank.pb.h"

namespace loom::agent {

struct RankUser {
  confine::FileOwner owner;   // uid/gid the rank runs as and its files belong to; -1: the agent's
  std::vector<gid_t> groups;  // its supplementary groups
  // Its job's checkpoint directory: 0750 under per-job uids (the group is
  // the job's own and is lent only to jobs resuming from it), else 0700.
  mode_t checkpoint_mode = 0700;
};

// INVALID_ARGUMENT naming assignment.run_uid or assignment.resume_from_uid
// when a per-job range is set and the uid lies outside it (0 included): such
// a job cannot run on this node.
absl::StatusOr<RankUser> RankUserFor(const loom::v1::RankAssignment& assignment,
                                     const std::optional<confine::UidRange>& job_uids,
                                     const confine::FileOwner& run_as);

}  // namespace loom::agent
