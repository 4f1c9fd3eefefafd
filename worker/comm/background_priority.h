// Work that must yield the CPU to training: the in-memory snapshot copies to
// and from a rank's buddy (docs/fault_tolerance.md, "What a snapshot costs a
// step"). On a node whose cores the ranks keep busy, a copy at the ranks'
// priority takes its CPU time out of their steps; at the lowest priority
// (nice 19) it runs in the gaps, mostly while the ranks wait in collectives.
// Linux keeps a nice value per thread and a new thread inherits its
// creator's, so the Gloo transport thread of a pair group is lowered by
// creating the group on a lowered thread. An unprivileged thread cannot raise
// its priority again (RLIMIT_NICE), hence whole threads, never a section.
#pragma once

#include <optional>
#include <thread>
#include <utility>

namespace loom::comm {

inline constexpr int kBackgroundNice = 19;

// Lowers the calling thread to kBackgroundNice. Best effort: false when the
// system refuses (the thread then stays as it was).
bool LowerThisThreadToBackground();

// Runs fn() on a new thread lowered to the background (with every thread fn
// starts) and returns its result.
template <typename Fn>
auto RunOnBackgroundThread(Fn&& fn) -> decltype(fn()) {
  std::optional<decltype(fn())> result;
  std::thread worker([&] {
    LowerThisThreadToBackground();
    result.emplace(fn());
  });
  worker.join();
  return *std::move(result);
}

}  // namespace loom::comm
