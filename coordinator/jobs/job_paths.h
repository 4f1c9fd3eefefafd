// Where a job's files are, as the coordinator decides it at submission: the
// spec's data paths confined beneath --data_roots (common/confine), the
// checkpoint switch checked, the job's checkpoint directory under
// --checkpoint_root, and the unique prefix of this state directory's job ids.
// The node agent checks all of it again at launch with symlinks resolved.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/confine/uid_range.h"
#include "common/spec/job_spec.h"

namespace loom::coordinator {

struct FileRoots {
  std::vector<std::string> data_roots;  // absolute, normalised; at least one
  std::string checkpoint_root;          // absolute, normalised
  // --job_uid_range: each job gets its own uid from it, so that the files of
  // its ranks (and its checkpoint directory) are no other job's
  // (common/confine/uid_range.h); none: jobs get no uid.
  std::optional<confine::UidRange> job_uids;
};

// Rewrites data.train_path and data.val_path to absolute paths beneath the
// data roots, and checks checkpoint.dir (a relative name, only a switch) and
// checkpoint.resume_from (a job id). INVALID_ARGUMENT naming the field and
// the rule otherwise; base_dir from the client plays no part.
absl::Status ConfineSpecPaths(spec::JobSpec& spec, const FileRoots& roots);

// The job's checkpoint directory, <checkpoint_root>/<owner>/<job_id>; empty
// when the spec takes no checkpoints.
absl::StatusOr<std::string> CheckpointDirOf(const spec::JobSpec& spec, const FileRoots& roots,
                                            const std::string& owner, const std::string& job_id);

// The random prefix that makes this state directory's job ids unique among
// coordinators ("3f9a1c"): read from <state_dir>/job_id_prefix, created on
// first use (never changed afterwards, so ids stay stable across restarts).
absl::StatusOr<std::string> LoadOrCreateJobIdPrefix(const std::string& state_dir);

}  // namespace loom::coordinator
