#include "common/confine/path_resolve.h"

#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "common/confine/path_rules.h"

namespace loom::confine {
namespace {

std::string RealPath(const std::string& path, int* error) {
  char resolved[PATH_MAX];
  if (realpath(path.c_str(), resolved) == nullptr) {
    *error = errno;
    return "";
  }
  *error = 0;
  return resolved;
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  void reset(int fd) {
    if (fd_ >= 0) close(fd_);
    fd_ = fd;
  }

 private:
  int fd_;
};

}  // namespace

absl::StatusOr<std::string> ResolveBeneath(const std::string& path,
                                           const std::vector<std::string>& roots,
                                           const std::string& field) {
  if (absl::Status s = CheckPathText(path, field); !s.ok()) return s;
  int error = 0;
  const std::string resolved = RealPath(path, &error);
  if (resolved.empty()) {
    if (error == ENOENT || error == ENOTDIR) {
      return absl::NotFoundError(
          absl::StrCat(field, "='", Printable(path), "' does not exist on this node"));
    }
    return absl::InvalidArgumentError(absl::StrCat(field, "='", Printable(path),
                                                   "' cannot be resolved: ", strerror(error)));
  }
  for (const std::string& root : roots) {
    int root_error = 0;
    const std::string real_root = RealPath(root, &root_error);
    if (!real_root.empty() && IsBeneath(resolved, real_root)) return resolved;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      field, "='", Printable(path), "' resolves (through a symlink) to a place outside the data "
      "roots of this node (--data_roots)"));
}

absl::StatusOr<std::string> MakeDirsBeneath(const std::string& base,
                                            const std::vector<std::string>& components,
                                            bool fresh_last, FileOwner owner,
                                            mode_t last_mode) {
  Fd dir(open(base.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir.get() < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open directory '", base, "': ", strerror(errno)));
  }
  std::string path = base;
  for (size_t i = 0; i < components.size(); ++i) {
    const std::string& name = components[i];
    if (!IsSafeName(name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", Printable(name), "' cannot name a directory (letters, digits, '.', '_', '-')"));
    }
    path = absl::StrCat(path, "/", name);
    const bool last = i + 1 == components.size();
    const bool handed = owner.uid != static_cast<uid_t>(-1);
    if (mkdirat(dir.get(), name.c_str(), handed && !last ? 0711 : 0700) == 0) {
      if (handed && last &&
          fchownat(dir.get(), name.c_str(), owner.uid, owner.gid, AT_SYMLINK_NOFOLLOW) != 0) {
        return absl::PermissionDeniedError(
            absl::StrCat("cannot hand directory '", path, "' to the rank user: ", strerror(errno)));
      }
      // Exactly last_mode, whatever the umask took from mkdir's.
      if (last && last_mode != 0700 && fchmodat(dir.get(), name.c_str(), last_mode, 0) != 0) {
        return absl::FailedPreconditionError(
            absl::StrCat("cannot set the mode of '", path, "': ", strerror(errno)));
      }
    } else if (errno != EEXIST) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot create directory '", path, "': ", strerror(errno)));
    } else if (last && fresh_last) {
      return absl::AlreadyExistsError(absl::StrCat(
          "directory '", path, "' already exists; it is created fresh and never reused"));
    }
    int next = openat(dir.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (next < 0) {
      const std::string why = errno == ELOOP || errno == ENOTDIR
                                  ? std::string("it is a symlink or not a directory (refused)")
                                  : std::string(strerror(errno));
      return absl::FailedPreconditionError(absl::StrCat("cannot enter '", path, "': ", why));
    }
    dir.reset(next);
    struct stat info = {};
    if (last && handed && (fstat(dir.get(), &info) != 0 || info.st_uid != owner.uid)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "directory '", path, "' belongs to uid ", info.st_uid, ", not to uid ", owner.uid,
          " that the rank runs as (it is another user's; refused)"));
    }
  }
  return path;
}

absl::StatusOr<int> CreateNewFile(const std::string& path, mode_t mode) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
  if (fd < 0) {
    if (errno == EEXIST) {
      return absl::AlreadyExistsError(absl::StrCat(
          "'", path, "' already exists (or is a symlink); it is never overwritten or followed"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create '", path, "': ", strerror(errno)));
  }
  return fd;
}

}  // namespace loom::confine
