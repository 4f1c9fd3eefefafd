// The pure rules of file confinement: which paths a job spec may name, how
// they resolve beneath the configured roots, and where a job's checkpoints
// live. Text only (no file system), so the coordinator checks a spec at
// submission with the same rules the agent applies again at launch, where
// path_resolve.h adds the symlink resolution.
//
// Rules, each named in the errors:
//   - a path is non-empty, at most kMaxPathLength bytes, without NUL bytes;
//   - no '..' component, anywhere (so no path walks out of its root);
//   - a relative path resolves beneath the first root;
//   - an absolute path must lie beneath one of the roots;
//   - a job's checkpoints live in <checkpoint_root>/<owner>/<job_id>/.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace loom::confine {

inline constexpr size_t kMaxPathLength = 4096;
// The owner directory of jobs whose owner is not known (before identities).
inline constexpr char kDefaultOwner[] = "default";

// The value as it may be shown in an error: printable, escaped, cut short.
std::string Printable(const std::string& value);

// A root from a flag: made absolute against cwd, normalised, no trailing '/'.
// Refuses an empty value, NUL bytes and '..' components (flag names the flag).
absl::StatusOr<std::string> NormalizeRoot(const std::string& value, const std::string& cwd,
                                          const std::string& flag);
// A comma-separated --data_roots value; at least one root.
absl::StatusOr<std::vector<std::string>> ParseRoots(const std::string& value, const std::string& cwd,
                                                    const std::string& flag);

// The text checks every spec path passes (non-empty, length, NUL, '..').
absl::Status CheckPathText(const std::string& path, const std::string& field);

// Whether the normalised absolute `path` is `root` or lies beneath it (by
// whole components: /data2 is not beneath /data).
bool IsBeneath(const std::string& path, const std::string& root);

// A data path of a spec (field names it in errors), made absolute and
// normalised beneath the roots; INVALID_ARGUMENT naming the rule otherwise.
absl::StatusOr<std::string> ConfineDataPath(const std::string& path,
                                            const std::vector<std::string>& roots,
                                            const std::string& field);

// checkpoint.dir only switches checkpoints on (empty: none). It never chooses
// the location, so it must be a plain relative name: no '/' at the start, no
// '..', no NUL.
absl::Status CheckCheckpointName(const std::string& dir, const std::string& field);

// The directory name of an owner: the owner itself when it is 1-128 letters,
// digits, '.', '_', '-' (and not "." or ".."), "default" when empty, else
// "x-" and its bytes in hex, so that no owner name can become a path.
std::string OwnerDirName(const std::string& owner);

// Whether a job id can name a directory: 1-200 letters, digits, '.', '_',
// '-', and not "." or "..".
bool IsSafeName(const std::string& name);

// <checkpoint_root>/<OwnerDirName(owner)>/<job_id>; the job id must be a
// safe name.
absl::StatusOr<std::string> JobCheckpointDir(const std::string& checkpoint_root,
                                             const std::string& owner, const std::string& job_id);

}  // namespace loom::confine
