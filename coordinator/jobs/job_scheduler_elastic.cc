// The scheduler's part of elastic jobs (job_scheduler.h;
// docs/fault_tolerance.md, "Elastic jobs"): a job with
// fault_tolerance.min_ranks that is placed again (after a failure, or to grow
// back) goes to the largest size the free devices allow, up to the one it
// asked for, as elastic_policy.h decides: grown back when it runs below it and
// more devices are free, shrunk when its own size no longer fits. Without the
// lock, like any placement; the lifecycle records the resize at the commit.
#include <algorithm>
#include <map>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/spec/job_spec_yaml.h"
#include "common/spec/layout.h"
#include "coordinator/jobs/job_scheduler.h"

namespace loom::coordinator {
using loom::v1::JobState;

std::optional<JobScheduler::Result> JobScheduler::PlaceElastic(
    const Snapshot& snapshot, const topology::PlacementRequest& request) const {
  const spec::JobSpec& current = snapshot.spec;
  // Placed again after a failure, or after it stopped (to grow back, or
  // preempted): at the largest size the free devices allow.
  if ((snapshot.state != JobState::RESTARTING && snapshot.state != JobState::PREEMPTED) ||
      current.fault_tolerance.min_ranks <= 0) {
    return std::nullopt;
  }
  absl::StatusOr<spec::JobSpec> requested = RequestedSpec(snapshot.spec_yaml, current);
  if (!requested.ok()) return std::nullopt;
  // Free devices (the job's own included: its ranks have exited); nodes to
  // avoid count too, PlaceRanks uses them last.
  int64_t available = 0;
  for (const topology::NodeDevices& node : request.nodes) available += node.free_devices;

  auto place = [&](ElasticDecision decision) -> std::optional<Result> {
    topology::PlacementRequest resized_request = request;
    resized_request.shape = spec::LayoutOf(decision.spec);
    absl::StatusOr<topology::Placement> placement = topology::PlaceRanks(resized_request);
    if (!placement.ok()) return std::nullopt;
    Snapshot resized = snapshot;
    resized.spec = decision.spec;
    resized.resolved_spec_yaml = spec::ToYaml(decision.spec);
    Result result;
    BuildAttempt(resized, *placement, nullptr, result);
    if (result.fits) ReserveSpares(decision.spec, request, *placement, snapshot.attempt == 0, result);
    if (result.fits) result.resize = std::move(decision);
    return result;
  };

  // Below its size with more devices free: back to the largest size they hold.
  if (current.resources.world_size() < requested->resources.world_size()) {
    ElasticDecision grow =
        DecideGrow(*requested, current, available, absl::Now(), absl::InfinitePast());
    if (grow.action == ElasticAction::kResize) {
      if (std::optional<Result> result = place(std::move(grow))) return result;
    }
  }
  // Its own size fits: placed as any job.
  if (topology::PlaceRanks(request).ok()) return std::nullopt;
  ElasticDecision shrink = DecideShrink(
      *requested, current, available,
      absl::StrCat("its ", current.resources.world_size(), " ranks no longer fit the ", available,
                   " free devices"));
  if (shrink.action == ElasticAction::kResize &&
      shrink.ranks != current.resources.world_size()) {
    if (std::optional<Result> result = place(std::move(shrink))) return result;
  }
  Result waits;
  if (shrink.action == ElasticAction::kWait) waits.waits_because = shrink.reason;
  return waits;
}

void JobScheduler::ReserveSpares(const spec::JobSpec& spec,
                                 const topology::PlacementRequest& request,
                                 const topology::Placement& placement, bool first,
                                 Result& result) {
  const int64_t wanted = spec.resources.spares;
  if (wanted <= 0) return;
  std::map<std::string, std::set<int64_t>> used;  // by the job's ranks
  for (const topology::DeviceSlot& slot : placement.slots) {
    used[slot.node_id].insert(slot.local_device);
  }
  // Spares help only where the job's ranks are not (a node lost takes both):
  // nodes without its ranks first, the most free devices first (spares
  // together), nodes to avoid last.
  struct Room {
    const topology::NodeDevices* node;
    std::vector<int64_t> free;
    int tier;
  };
  std::vector<Room> rooms;
  for (const topology::NodeDevices& node : request.nodes) {
    Room room{&node, {}, 0};
    const auto on = used.find(node.node_id);
    for (int64_t i = 0; i < node.free_devices; ++i) {
      const int64_t device = node.device_ids.empty() ? i : node.device_ids[i];
      if (on == used.end() || on->second.count(device) == 0) room.free.push_back(device);
    }
    if (room.free.empty()) continue;
    room.tier = (on != used.end() ? 1 : 0) + (request.avoid.count(node.node_id) > 0 ? 2 : 0);
    rooms.push_back(std::move(room));
  }
  std::stable_sort(rooms.begin(), rooms.end(), [](const Room& a, const Room& b) {
    if (a.tier != b.tier) return a.tier < b.tier;
    return a.free.size() > b.free.size();
  });
  for (const Room& room : rooms) {
    for (int64_t device : room.free) {
      if (static_cast<int64_t>(result.attempt.spares.size()) == wanted) break;
      loom::v1::RankPlacement& spare = result.attempt.spares.emplace_back();
      spare.set_rank(-1);
      spare.set_node_id(room.node->node_id);
      spare.set_local_device(static_cast<int32_t>(device));
      spare.set_place("spare");
    }
  }
  if (first && static_cast<int64_t>(result.attempt.spares.size()) < wanted) {
    result = Result();  // ranks and spares are placed together, or the job waits
  }
}

}  // namespace loom::coordinator
