#include "coordinator/jobs/job_paths.h"

#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/confine/path_rules.h"

namespace loom::coordinator {

absl::Status ConfineSpecPaths(spec::JobSpec& spec, const FileRoots& roots) {
  absl::StatusOr<std::string> train =
      confine::ConfineDataPath(spec.data.train_path, roots.data_roots, "data.train_path");
  if (!train.ok()) return train.status();
  spec.data.train_path = *train;
  if (!spec.data.val_path.empty()) {
    absl::StatusOr<std::string> val =
        confine::ConfineDataPath(spec.data.val_path, roots.data_roots, "data.val_path");
    if (!val.ok()) return val.status();
    spec.data.val_path = *val;
  }
  if (absl::Status s = confine::CheckCheckpointName(spec.checkpoint.dir, "checkpoint.dir");
      !s.ok()) {
    return s;
  }
  const std::string& from = spec.checkpoint.resume_from;
  if (!from.empty()) {
    if (!confine::IsSafeName(from)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint.resume_from='", confine::Printable(from),
          "' must be a job id (letters, digits, '.', '_', '-'), not a path"));
    }
    if (spec.checkpoint.dir.empty()) {
      return absl::InvalidArgumentError(
          "checkpoint.resume_from needs checkpoint.dir set (checkpoints on)");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> CheckpointDirOf(const spec::JobSpec& spec, const FileRoots& roots,
                                            const std::string& owner, const std::string& job_id) {
  if (spec.checkpoint.dir.empty()) return std::string();
  return confine::JobCheckpointDir(roots.checkpoint_root, owner, job_id);
}

absl::StatusOr<std::string> LoadOrCreateJobIdPrefix(const std::string& state_dir) {
  const std::string path = state_dir + "/job_id_prefix";
  auto valid = [](const std::string& p) {
    if (p.size() != 6) return false;
    for (char c : p) {
      if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
    }
    return true;
  };
  {
    std::ifstream in(path);
    std::string prefix;
    if (in && std::getline(in, prefix)) {
      if (valid(prefix)) return prefix;
      return absl::DataLossError(
          absl::StrCat(path, " does not hold 6 hex digits; remove it only if no job exists yet"));
    }
  }
  unsigned char random[3];
  if (getrandom(random, sizeof(random), 0) != static_cast<ssize_t>(sizeof(random))) {
    return absl::InternalError(absl::StrCat("getrandom failed: ", std::strerror(errno)));
  }
  const std::string prefix = absl::BytesToHexString(
      std::string(reinterpret_cast<const char*>(random), sizeof(random)));
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    if (errno == EEXIST) {
      return absl::UnavailableError(absl::StrCat(path, " is being written by another process"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create ", path, ": ", std::strerror(errno)));
  }
  const std::string line = prefix + "\n";
  const bool written = write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size()) &&
                       fsync(fd) == 0;
  close(fd);
  if (!written) return absl::InternalError(absl::StrCat("cannot write ", path));
  return prefix;
}

}  // namespace loom::coordinator
