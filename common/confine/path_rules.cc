#include "common/confine/path_rules.h"

#include <algorithm>
#include <cctype>
#include <filesystem>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace loom::confine {
namespace {

namespace fs = std::filesystem;

bool HasDotDot(const std::string& path) {
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    if (part == "..") return true;
  }
  return false;
}

std::string Normalize(const fs::path& p) {
  std::string s = p.lexically_normal().string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

}  // namespace

std::string Printable(const std::string& value) {
  constexpr size_t kShown = 200;
  std::string shown = absl::CHexEscape(value.substr(0, std::min(value.size(), kShown)));
  if (value.size() > kShown) absl::StrAppend(&shown, "...");
  return shown;
}

absl::Status CheckPathText(const std::string& path, const std::string& field) {
  if (path.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, " is empty: it must name a path"));
  }
  if (path.size() > kMaxPathLength) {
    return absl::InvalidArgumentError(absl::StrCat(field, " is ", path.size(),
                                                   " bytes long; a path has at most ",
                                                   kMaxPathLength));
  }
  if (path.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, "='", Printable(path), "' contains a NUL byte"));
  }
  if (HasDotDot(path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, "='", Printable(path), "' must not contain a '..' component (paths stay beneath "
        "their root)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> NormalizeRoot(const std::string& value, const std::string& cwd,
                                          const std::string& flag) {
  if (absl::Status s = CheckPathText(value, absl::StrCat("--", flag)); !s.ok()) return s;
  fs::path p(value);
  if (!p.is_absolute()) p = fs::path(cwd) / p;
  return Normalize(p);
}

absl::StatusOr<std::vector<std::string>> ParseRoots(const std::string& value, const std::string& cwd,
                                                    const std::string& flag) {
  std::vector<std::string> roots;
  for (absl::string_view part : absl::StrSplit(value, ',', absl::SkipEmpty())) {
    absl::StatusOr<std::string> root = NormalizeRoot(std::string(part), cwd, flag);
    if (!root.ok()) return root.status();
    roots.push_back(*std::move(root));
  }
  if (roots.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " names no directory"));
  }
  return roots;
}

bool IsBeneath(const std::string& path, const std::string& root) {
  if (root == "/") return !path.empty() && path[0] == '/';
  if (path.substr(0, root.size()) != root) return false;
  return path.size() == root.size() || path[root.size()] == '/';
}

absl::StatusOr<std::string> ConfineDataPath(const std::string& path,
                                            const std::vector<std::string>& roots,
                                            const std::string& field) {
  if (absl::Status s = CheckPathText(path, field); !s.ok()) return s;
  if (roots.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(field, ": no data roots are configured (--data_roots)"));
  }
  fs::path p(path);
  if (!p.is_absolute()) return Normalize(fs::path(roots.front()) / p);
  const std::string normal = Normalize(p);
  for (const std::string& root : roots) {
    if (IsBeneath(normal, root)) return normal;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      field, "='", Printable(path), "' is an absolute path outside the data roots (--data_roots); "
      "name a file beneath one of them, or a path relative to the first"));
}

absl::Status CheckCheckpointName(const std::string& dir, const std::string& field) {
  if (dir.empty()) return absl::OkStatus();
  if (absl::Status s = CheckPathText(dir, field); !s.ok()) return s;
  if (dir.front() == '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        field, "='", Printable(dir), "' must be a relative name: a job's checkpoints always live "
        "in <checkpoint_root>/<owner>/<job_id>/, and this field only switches them on"));
  }
  return absl::OkStatus();
}

bool IsSafeName(const std::string& name) {
  if (name.empty() || name.size() > 200 || name == "." || name == "..") return false;
  for (char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') {
      return false;
    }
  }
  return true;
}

std::string OwnerDirName(const std::string& owner) {
  if (owner.empty()) return kDefaultOwner;
  if (owner.size() <= 128 && IsSafeName(owner)) return std::string(owner);
  return absl::StrCat("x-", absl::BytesToHexString(owner.substr(0, 100)));
}

absl::StatusOr<std::string> JobCheckpointDir(const std::string& checkpoint_root,
                                             const std::string& owner, const std::string& job_id) {
  if (!IsSafeName(job_id)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job id '", Printable(job_id), "' must be 1-200 letters, digits, '.', '_' or '-'"));
  }
  return absl::StrCat(checkpoint_root, "/", OwnerDirName(owner), "/", job_id);
}

}  // namespace loom::confine
