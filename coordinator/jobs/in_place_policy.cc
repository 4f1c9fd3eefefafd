#include "coordinator/jobs/in_place_policy.h"

#include <algorithm>
#include <iterator>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/rank_list.h"
#include "coordinator/jobs/relaunch_placement.h"

namespace loom::coordinator {
namespace {

absl::Status CheckRequest(const InPlaceRequest& request) {
  const int64_t world = static_cast<int64_t>(request.placement.size());
  if (world == 0) return absl::InvalidArgumentError("in-place request: the placement is empty");
  if (request.tp < 1 || world % request.tp != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("in-place request: tp=", request.tp, " does not divide the world of ", world));
  }
  if (!request.ring.buddy.empty() && (static_cast<int64_t>(request.ring.buddy.size()) != world ||
                                      request.ring.ward.size() != request.ring.buddy.size())) {
    return absl::InvalidArgumentError(absl::StrCat("in-place request: the ring has ",
                                                   request.ring.buddy.size(),
                                                   " ranks, the placement ", world));
  }
  for (int64_t rank : request.failed_ranks) {
    if (rank < 0 || rank >= world) {
      return absl::InvalidArgumentError(
          absl::StrCat("in-place request: failed rank ", rank, " is outside the world of ", world));
    }
  }
  return absl::OkStatus();
}

InPlaceDecision WholeJob(std::string reason) {
  InPlaceDecision decision;
  decision.fallback_reason = std::move(reason);
  return decision;
}

// " (node n2 was lost)" when the failure was a lost node, else "".
std::string LostSuffix(const InPlaceRequest& request) {
  if (request.lost_nodes.empty()) return "";
  return absl::StrCat(" (node", request.lost_nodes.size() > 1 ? "s " : " ",
                      absl::StrJoin(request.lost_nodes, ", "),
                      request.lost_nodes.size() > 1 ? " were" : " was", " lost)");
}

// Why a failed rank's snapshot has no copy left, or nullopt when it has one.
std::optional<std::string> MissingCopy(const InPlaceRequest& request,
                                       const topology::SnapshotRing& ring,
                                       const std::set<int64_t>& failed, int64_t rank) {
  const int64_t buddy = ring.BuddyOf(rank);
  if (buddy >= 0) {
    if (failed.count(buddy) == 0) return std::nullopt;
    return absl::StrCat("rank ", rank, " and its buddy rank ", buddy,
                        ", which holds its snapshot copies, failed together", LostSuffix(request));
  }
  return absl::StrCat("rank ", rank, " has no buddy to hold a copy of its snapshots: it is the one "
                      "rank of node ", request.placement[rank].node_id,
                      " that no other rank can pair with (docs/topology.md, snapshot ring)");
}

std::string StepList(const std::vector<int64_t>& steps) {
  return steps.empty() ? "none" : absl::StrJoin(steps, ", ");
}

std::vector<int64_t> Intersect(const std::vector<int64_t>& sorted,
                               const google::protobuf::RepeatedField<int64_t>& steps) {
  std::vector<int64_t> other(steps.begin(), steps.end());
  std::sort(other.begin(), other.end());
  std::vector<int64_t> out;
  std::set_intersection(sorted.begin(), sorted.end(), other.begin(), other.end(),
                        std::back_inserter(out));
  return out;
}

}  // namespace

bool InPlaceDecision::IsRelaunched(int64_t rank) const { return RelaunchOf(rank) != nullptr; }

const Relaunch* InPlaceDecision::RelaunchOf(int64_t rank) const {
  auto it = std::lower_bound(relaunched.begin(), relaunched.end(), rank,
                             [](const Relaunch& r, int64_t value) { return r.rank < value; });
  return it != relaunched.end() && it->rank == rank ? &*it : nullptr;
}

std::vector<int64_t> FailedRanks(const InPlaceRequest& request) {
  std::set<int64_t> failed = request.failed_ranks;
  if (!request.lost_nodes.empty()) {
    for (size_t r = 0; r < request.placement.size(); ++r) {
      if (request.lost_nodes.count(request.placement[r].node_id) > 0) {
        failed.insert(static_cast<int64_t>(r));
      }
    }
  }
  return {failed.begin(), failed.end()};
}

std::string SpecRefusal(const spec::FaultToleranceSpec& ft) {
  if (!ft.in_place) return "in-place recovery is off (fault_tolerance.in_place: false)";
  if (ft.snapshot_interval <= 0) {
    return "in-place recovery needs in-memory snapshots, and fault_tolerance.snapshot_interval "
           "is 0";
  }
  return "";
}

absl::StatusOr<InPlaceDecision> PlanRelaunch(const InPlaceRequest& request) {
  if (absl::Status s = CheckRequest(request); !s.ok()) return s;
  if (std::string refused = SpecRefusal(request.fault_tolerance); !refused.empty()) {
    return WholeJob(std::move(refused));
  }
  const std::vector<int64_t> failed_list = FailedRanks(request);
  const std::set<int64_t> failed(failed_list.begin(), failed_list.end());
  const int64_t world = static_cast<int64_t>(request.placement.size());
  if (failed.empty()) {
    return WholeJob("the failure names no rank or node to relaunch");
  }
  if (static_cast<int64_t>(failed.size()) == world) {
    return WholeJob(absl::StrCat("every rank failed", LostSuffix(request),
                                 "; no survivor is left to recover in place"));
  }
  const topology::SnapshotRing ring =
      request.ring.buddy.empty() ? topology::BuildSnapshotRing(request.placement) : request.ring;
  for (int64_t rank : failed) {
    if (std::optional<std::string> why = MissingCopy(request, ring, failed, rank)) {
      return WholeJob(*std::move(why));
    }
  }

  RelaunchPlacementRequest where{.tp = request.tp,
                                 .placement = request.placement,
                                 .failed = failed,
                                 .lost_nodes = request.lost_nodes,
                                 .nodes = request.nodes,
                                 .avoid = request.avoid};
  RelaunchPlacement placed = PlaceRelaunchedRanks(where);
  if (!placed.ok() && request.spill_when_no_room) {
    InPlaceDecision spill = WholeJob(std::move(placed.error));
    spill.spill = true;
    spill.newest_step = request.newest_step;
    for (int64_t rank : failed) {
      Relaunch& r = spill.relaunched.emplace_back();
      r.rank = rank;
      r.from = r.to = request.placement[rank];
      r.peer = ring.BuddyOf(rank);
    }
    return spill;
  }
  if (!placed.ok()) return WholeJob(std::move(placed.error));

  InPlaceDecision decision;
  decision.in_place = true;
  decision.newest_step = request.newest_step;
  decision.placement = std::move(placed.slots);
  decision.ring = topology::BuildSnapshotRing(decision.placement);
  for (int64_t rank : failed) {
    Relaunch& r = decision.relaunched.emplace_back();
    r.rank = rank;
    r.from = request.placement[rank];
    r.to = decision.placement[rank];
    r.peer = ring.BuddyOf(rank);
    decision.sends[r.peer].push_back(rank);
  }
  return decision;
}

absl::StatusOr<InPlaceDecision> DecideInPlace(const InPlaceRequest& request) {
  absl::StatusOr<InPlaceDecision> decision = PlanRelaunch(request);
  if (!decision.ok() || (!decision->in_place && !decision->spill)) return decision;
  const int64_t world = static_cast<int64_t>(request.placement.size());

  // Every survivor must have left its collectives and said what it holds.
  std::vector<int64_t> missing;
  int64_t newest = request.newest_step;
  for (int64_t rank = 0; rank < world; ++rank) {
    if (decision->IsRelaunched(rank)) continue;
    auto it = request.aborted.find(rank);
    if (it == request.aborted.end()) {
      missing.push_back(rank);
    } else {
      newest = std::max(newest, it->second.step());
    }
  }
  if (!missing.empty()) {
    const bool one = missing.size() == 1;
    std::string reason = absl::StrCat(one ? "rank " : "ranks ", RankList(missing),
                                      " did not report leaving ", one ? "its" : "their",
                                      " collectives within fault_tolerance.abort_timeout_s (",
                                      request.fault_tolerance.abort_timeout_s, " s)");
    for (int64_t rank : missing) {
      auto seen = request.last_seen.find(rank);
      if (seen == request.last_seen.end() || seen->second.empty()) continue;
      absl::StrAppend(&reason, "; rank ", rank,
                      seen->second == "never reported" ? " " : " was in phase ", seen->second);
    }
    return WholeJob(std::move(reason));
  }

  // A killed rank still running would share its place with its relaunch.
  if (!request.not_exited.empty()) {
    const std::vector<int64_t> alive(request.not_exited.begin(), request.not_exited.end());
    const bool one = alive.size() == 1;
    return WholeJob(absl::StrCat(one ? "rank " : "ranks ", RankList(alive),
                                 one ? " was" : " were", " killed but did not exit within "
                                 "fault_tolerance.abort_timeout_s (",
                                 request.fault_tolerance.abort_timeout_s, " s)"));
  }

  // The steps every survivor holds its own snapshot of...
  std::optional<std::vector<int64_t>> common;
  for (int64_t rank = 0; rank < world; ++rank) {
    if (decision->IsRelaunched(rank)) continue;
    const loom::v1::SnapshotHoldings& held = request.aborted.at(rank).snapshots();
    std::vector<int64_t> own(held.own_steps().begin(), held.own_steps().end());
    std::sort(own.begin(), own.end());
    std::vector<int64_t> next = common ? Intersect(*common, held.own_steps()) : own;
    if (next.empty()) {
      return WholeJob(absl::StrCat(
          "the survivors hold no snapshot step in common: rank ", rank, " holds steps ",
          StepList(own),
          common ? absl::StrCat(", the ranks before it ", StepList(*common)) : std::string()));
    }
    common = std::move(next);
  }
  // ...and of which the old buddy of every failed rank holds the copy.
  for (const Relaunch& r : decision->relaunched) {
    const loom::v1::SnapshotHoldings& held = request.aborted.at(r.peer).snapshots();
    if (held.ward_rank() != r.rank) {
      return WholeJob(absl::StrCat("rank ", r.peer, ", the buddy of rank ", r.rank,
                                   ", holds no copy of its snapshots"));
    }
    std::vector<int64_t> next = Intersect(*common, held.ward_steps());
    if (next.empty()) {
      std::vector<int64_t> copies(held.ward_steps().begin(), held.ward_steps().end());
      return WholeJob(
          absl::StrCat("no snapshot step is held by every survivor and by the buddies "
                       "of the failed ranks: the survivors hold steps ",
                       StepList(*common), ", rank ", r.peer, " holds copies of rank ", r.rank,
                       "'s steps ", StepList(copies)));
    }
    common = std::move(next);
  }
  decision->restore_step = common->back();
  decision->newest_step = newest;
  decision->steps_recomputed = std::max<int64_t>(0, newest - decision->restore_step);
  return decision;
}

}  // namespace loom::coordinator
