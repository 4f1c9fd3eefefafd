#include "worker/engine/checkpoint/commit_faults.h"

#include <utility>

namespace loom::engine {
namespace {

CommitFaultHook& Hook() {
  static CommitFaultHook hook;
  return hook;
}

}  // namespace

const char* CommitPointName(CommitPoint point) {
  switch (point) {
    case CommitPoint::kFilesWritten: return "files_written";
    case CommitPoint::kBeforeMetadata: return "before_metadata";
    case CommitPoint::kBeforeRename: return "before_rename";
  }
  return "?";
}

void SetCommitFaultHook(CommitFaultHook hook) { Hook() = std::move(hook); }

void RunCommitFaultHook(CommitPoint point, int64_t step, const std::string& path) {
  if (Hook()) Hook()(point, step, path);
}

}  // namespace loom::engine
