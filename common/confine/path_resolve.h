// The file-system half of confinement, used by the node agent at launch:
// resolving a spec's path with its symlinks and checking that it still lies
// beneath a root, and making directories and files without following
// symlinks that someone else may have planted. The text rules are in
// path_rules.h. Error messages name paths and rules, never file contents.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace loom::confine {

// realpath(path) when it and every root resolve and the result lies beneath
// one resolved root; INVALID_ARGUMENT naming field and the rule otherwise
// (NOT_FOUND when the path does not exist).
absl::StatusOr<std::string> ResolveBeneath(const std::string& path,
                                           const std::vector<std::string>& roots,
                                           const std::string& field);

// Who owns what MakeDirsBeneath creates; -1: leave it to this process.
struct FileOwner {
  uid_t uid = static_cast<uid_t>(-1);
  gid_t gid = static_cast<gid_t>(-1);
};

// Walks `components` below the existing directory `base` with openat(2) and
// O_NOFOLLOW (a symlink anywhere on the way is refused), creating missing
// directories with mode 0700. The last one is handed to `owner` when one is
// given; the ones above it then get 0711, so that owner can reach it without
// listing or writing them, and the last gets last_mode (0750 lets the
// owner's group read it). With fresh_last the last component must not exist
// yet (ALREADY_EXISTS otherwise); without it, an existing last directory must
// already belong to `owner` when one is given (FAILED_PRECONDITION naming
// both uids otherwise: it is another user's). Each component must be a safe
// name (IsSafeName). Returns base/components....
absl::StatusOr<std::string> MakeDirsBeneath(const std::string& base,
                                            const std::vector<std::string>& components,
                                            bool fresh_last, FileOwner owner = {},
                                            mode_t last_mode = 0700);

// Opens a new file for writing: O_CREAT | O_EXCL | O_NOFOLLOW, so an existing
// file or a planted symlink is refused, never truncated or followed.
absl::StatusOr<int> CreateNewFile(const std::string& path, mode_t mode = 0600);

}  // namespace loom::confine
