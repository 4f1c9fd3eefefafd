// How many in-memory snapshot generations a rank keeps for in-place
// recovery (docs/fault_tolerance.md, "Snapshots"): the keeper holds them
// (worker/engine/snapshot_keeper.h) and the planner counts them in host
// memory (planner/layout.h). One number, read by both.
#pragma once

#include <cstddef>

namespace loom {

// Its own state: three. A rank captures step s+1 once its own copies of step
// s are done, but another rank's copy of s may still be in flight (a copy at
// low priority on a loaded node can outlast a step). If that rank dies then,
// its buddy holds its copies up to s-1 only, so every survivor must still
// hold s-1: it may be at s+1 but never further, since step s+2 cannot end
// without the dead rank.
inline constexpr size_t kOwnSnapshotGenerations = 3;
// Its ward's copies: three, for the same reason seen from the buddies. When
// a node with two ranks is lost, one of them may have died with its copy of
// s in flight (its buddy holds up to s-1) while the other had sent s and
// s+1 whole: its buddy must still hold s-1, the step both can restore. With
// two, a loaded machine met exactly this (rank 2's copies up to 51, rank
// 3's 52 and 53) and fell back to the whole job.
inline constexpr size_t kWardSnapshotGenerations = 3;

}  // namespace loom
