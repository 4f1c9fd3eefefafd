// A test hook into the checkpoint commit: called at each point where a crash
// would leave a partial checkpoint behind, so tests (and fault drills) can
// kill the process exactly there and check that the previous committed step
// is the one loaded. No hook is installed in normal runs.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace loom::engine {

enum class CommitPoint {
  kFilesWritten,    // every shard is in the temporary directory; path: the first shard
  kBeforeMetadata,  // the index is written, the commit record is not; path: the temp dir
  kBeforeRename,    // everything is written and synced, not yet renamed; path: the temp dir
};

const char* CommitPointName(CommitPoint point);

using CommitFaultHook = std::function<void(CommitPoint point, int64_t step, const std::string& path)>;
void SetCommitFaultHook(CommitFaultHook hook);
void RunCommitFaultHook(CommitPoint point, int64_t step, const std::string& path);

}  // namespace loom::engine
