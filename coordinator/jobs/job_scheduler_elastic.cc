// The scheduler's part of elastic jobs (job_scheduler.h;
// docs/fault_tolerance.md, "Elastic jobs"): a job with
// fault_tolerance.min_ranks that is placed again (after a failure, or to grow
// back) goes to the largest size the free devices allow, up to the one it
// asked for, as elastic_policy.h decides: grown back when it runs below it and
// more devices are free, shrunk when its own size no longer fits. Without the
// lock, like any placement; the lifecycle records the resize at the commit.
#include "absl/strings/str_cat.h"
#include "common/spec/job_spec_yaml.h"
#include "common/spec/layout.h"
#include "coordinator/jobs/job_scheduler.h"

namespace loom::coordinator {
using loom::v1::JobState;

std::optional<JobScheduler::Result> JobScheduler::PlaceElastic(
    const Snapshot& snapshot, const topology::PlacementRequest& request) const {
  const spec::JobSpec& current = snapshot.spec;
  if (snapshot.state != JobState::RESTARTING || current.fault_tolerance.min_ranks <= 0) {
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

}  // namespace loom::coordinator
