#include "worker/agent/rank_user.h"

namespace loom::agent {

absl::StatusOr<RankUser> RankUserFor(const loom::v1::RankAssignment& assignment,
                                     const std::optional<confine::UidRange>& job_uids,
                                     const confine::FileOwner& run_as) {
  RankUser user;
  if (!job_uids.has_value()) {
    user.owner = run_as;
    return user;
  }
  if (absl::Status s = confine::CheckJobUid(*job_uids, assignment.run_uid(), "assignment.run_uid");
      !s.ok()) {
    return s;
  }
  user.owner.uid = static_cast<uid_t>(assignment.run_uid());
  user.owner.gid = static_cast<gid_t>(assignment.run_uid());
  user.checkpoint_mode = 0750;
  // A job resuming from another reads that job's checkpoints through its
  // group (0750 directory); the other job's rank directories stay 0700.
  const uint32_t from = assignment.resume_from_uid();
  if (!assignment.resume_from_job().empty() && from != 0 && from != assignment.run_uid()) {
    if (absl::Status s = confine::CheckJobUid(*job_uids, from, "assignment.resume_from_uid");
        !s.ok()) {
      return s;
    }
    user.groups.push_back(static_cast<gid_t>(from));
  }
  return user;
}

}  // namespace loom::agent
