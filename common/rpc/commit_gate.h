// The checkpoint commit gate's key (docs/fault_tolerance.md, "Fencing"): a
// rank commits checkpoint `step` only after an add of CommitKey(step) in its
// attempt's store namespace succeeds. The coordinator's store fences keys
// under kCommitKeyPrefix (coordinator/rendezvous/kv_store.h); the trainer
// adds them. A wire contract, hence here and not in either program's code.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace loom::rpc {

inline constexpr std::string_view kCommitKeyPrefix = "loom/commit/";

inline std::string CommitKey(int64_t step) {
  return std::string(kCommitKeyPrefix) + std::to_string(step);
}

inline bool IsCommitKey(std::string_view key) {
  return key.substr(0, kCommitKeyPrefix.size()) == kCommitKeyPrefix;
}

}  // namespace loom::rpc
