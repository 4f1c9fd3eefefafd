#include "worker/agent/launch_paths.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/confine/path_rules.h"
#include "common/spec/job_spec_yaml.h"

namespace loom::agent {
namespace {

absl::Status ConfineDataFile(std::string& path, const LaunchRoots& roots,
                             const std::string& field) {
  if (path.empty()) return absl::OkStatus();
  absl::StatusOr<std::string> lexical = confine::ConfineDataPath(path, roots.data_roots, field);
  if (!lexical.ok()) return lexical.status();
  absl::StatusOr<std::string> real = confine::ResolveBeneath(*lexical, roots.data_roots, field);
  if (!real.ok()) return real.status();
  path = *real;
  return absl::OkStatus();
}

}  // namespace

absl::Status ConfineAssignment(loom::v1::RankAssignment& a, const LaunchRoots& roots) {
  absl::StatusOr<spec::JobSpec> spec =
      spec::ParseJobSpecYaml(a.spec_yaml(), absl::StrCat("job ", a.job_id()));
  if (!spec.ok()) return spec.status();
  const spec::DataSpec sent = spec->data;
  if (absl::Status s = ConfineDataFile(spec->data.train_path, roots, "data.train_path"); !s.ok()) {
    return s;
  }
  if (absl::Status s = ConfineDataFile(spec->data.val_path, roots, "data.val_path"); !s.ok()) {
    return s;
  }
  // The trainer opens the resolved paths (symlinks already followed here).
  if (spec->data.train_path != sent.train_path || spec->data.val_path != sent.val_path) {
    a.set_spec_yaml(spec::ToYaml(*spec));
  }
  if (!roots.data_roots.empty()) a.set_data_dir(roots.data_roots.front());

  if (!a.checkpoint_dir().empty()) {
    std::error_code error;
    std::filesystem::create_directories(roots.checkpoint_root, error);
    absl::StatusOr<std::string> made = confine::MakeDirsBeneath(
        roots.checkpoint_root, {confine::OwnerDirName(a.owner()), a.job_id()},
        /*fresh_last=*/false, roots.rank_owner, roots.checkpoint_mode);
    if (!made.ok()) {
      return absl::Status(made.status().code(),
                          absl::StrCat("checkpoint directory: ", made.status().message()));
    }
    a.set_checkpoint_dir(*made);
  }
  if (!a.resume_from_job().empty()) {
    absl::StatusOr<std::string> from =
        confine::JobCheckpointDir(roots.checkpoint_root, a.owner(), a.resume_from_job());
    if (!from.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint.resume_from: ", from.status().message()));
    }
    a.set_resume_from_dir(*from);
  } else {
    a.clear_resume_from_dir();
  }
  return absl::OkStatus();
}

}  // namespace loom::agent
