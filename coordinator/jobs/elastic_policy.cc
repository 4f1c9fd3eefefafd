// Elastic jobs' sizing decisions.
#include "coordinator/jobs/elastic_policy.h"

#include <algorithm>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/spec/job_spec_yaml.h"
#include "common/spec/layout.h"
#include "planner/job_planner.h"
#include "planner/layout.h"

namespace loom::coordinator {
namespace {

// How a resize's history line begins (LastResize finds it by them).
constexpr char kShrinks[] = "shrinks from ";
constexpr char kGrows[] = "grows back from ";

// The sizes a job may run at go in steps of whole nodes on GPUs (a node is
// lost whole), of one rank on CPUs.
int64_t SizeStep(const spec::JobSpec& job) {
  return job.resources.device == spec::DeviceKind::kGpu ? std::max<int64_t>(job.resources.gpus_per_node, 1)
                                                        : 1;
}

// The largest size in [low, high] (a multiple of the step) the planner lays
// the job out on: the requested spec itself at full size, else its re-plan.
// `last_error` keeps why the smallest size tried was refused.
struct Fit {
  int64_t ranks = 0;
  spec::JobSpec spec;
  std::string last_error;
};

Fit LargestFit(const spec::JobSpec& requested, int64_t low, int64_t high) {
  Fit fit;
  const int64_t step = SizeStep(requested);
  const int64_t full = requested.resources.world_size();
  for (int64_t n = (std::min(high, full) / step) * step; n >= std::max<int64_t>(low, 1); n -= step) {
    if (n == full) {
      fit.ranks = n;
      fit.spec = requested;
      return fit;
    }
    absl::StatusOr<spec::JobSpec> replanned = planner::ReplanOnRanks(requested, n);
    if (replanned.ok()) {
      fit.ranks = n;
      fit.spec = *std::move(replanned);
      return fit;
    }
    fit.last_error = absl::StrCat(n, " ranks: ", replanned.status().message());
  }
  return fit;
}

}  // namespace

absl::StatusOr<spec::JobSpec> RequestedSpec(const std::string& spec_yaml,
                                            const spec::JobSpec& current) {
  if (spec_yaml.empty()) return current;
  absl::StatusOr<spec::JobSpec> submitted = spec::ParseJobSpecYaml(spec_yaml, "the submitted spec");
  if (!submitted.ok()) return submitted.status();
  if (submitted->resources.world_size() == current.resources.world_size()) return current;
  if (absl::Status s = planner::ResolveLayout(*submitted); !s.ok()) return s;
  spec::JobSpec requested = current;
  requested.resources = submitted->resources;
  spec::ApplyLayout(spec::LayoutOf(*submitted), &requested);
  return requested;
}

absl::Time LastResize(const loom::v1::Job& job) {
  for (auto e = job.history().rbegin(); e != job.history().rend(); ++e) {
    if (absl::StartsWith(e->message(), kShrinks) || absl::StartsWith(e->message(), kGrows) ||
        absl::StartsWith(e->message(), kStopsToGrowBack)) {
      return absl::FromUnixMillis(e->time_unix_ms());
    }
  }
  return absl::InfinitePast();
}

std::string DescribeSize(const spec::JobSpec& spec) {
  return absl::StrCat(planner::LayoutToString(spec::LayoutOf(spec)), " (",
                      spec.resources.world_size(), " ranks)");
}

ElasticDecision DecideShrink(const spec::JobSpec& requested, const spec::JobSpec& current,
                             int64_t available_ranks, const std::string& why) {
  ElasticDecision d;
  const int64_t full = requested.resources.world_size();
  const int64_t min_ranks = requested.fault_tolerance.min_ranks;
  d.ranks = current.resources.world_size();
  if (available_ranks >= full) {
    d.reason = absl::StrCat("devices for all ", full, " ranks are available: no shrink");
    return d;
  }
  if (min_ranks <= 0) {
    d.action = ElasticAction::kWait;
    d.reason = absl::StrCat(why, "; waits for ", full, " ranks' devices (", available_ranks,
                            " available; fault_tolerance.min_ranks is not set, so the job does "
                            "not shrink)");
    return d;
  }
  if (available_ranks < min_ranks) {
    d.action = ElasticAction::kWait;
    d.reason = absl::StrCat(why, "; waits: ", available_ranks, " ranks' devices available, below "
                            "fault_tolerance.min_ranks=", min_ranks);
    return d;
  }
  Fit fit = LargestFit(requested, min_ranks, available_ranks);
  if (fit.ranks == 0) {
    d.action = ElasticAction::kWait;
    d.reason = absl::StrCat(why, "; waits: no layout of ", min_ranks, " to ", available_ranks,
                            " ranks runs the job (", fit.last_error, ")");
    return d;
  }
  d.action = ElasticAction::kResize;
  d.ranks = fit.ranks;
  d.reason = absl::StrCat(kShrinks, DescribeSize(current), " to ", DescribeSize(fit.spec),
                          ": ", why);
  d.spec = std::move(fit.spec);
  return d;
}

ElasticDecision DecideGrow(const spec::JobSpec& requested, const spec::JobSpec& current,
                           int64_t available_ranks, absl::Time now, absl::Time last_resize) {
  ElasticDecision d;
  const int64_t full = requested.resources.world_size();
  const int64_t size = current.resources.world_size();
  d.ranks = size;
  if (size >= full) {
    d.reason = "runs at its requested size";
    return d;
  }
  const int64_t step = SizeStep(requested);
  if (available_ranks < size + step) {
    d.reason = absl::StrCat("runs at ", size, " of ", full, " ranks: no more devices");
    return d;
  }
  const absl::Duration interval = absl::Seconds(requested.fault_tolerance.min_resize_interval_s);
  if (last_resize != absl::InfinitePast() && now - last_resize < interval) {
    d.reason = absl::StrCat("runs at ", size, " of ", full, " ranks: grows back no sooner than ",
                            "fault_tolerance.min_resize_interval_s=",
                            requested.fault_tolerance.min_resize_interval_s,
                            " s after its last resize");
    return d;
  }
  Fit fit = LargestFit(requested, size + 1, available_ranks);
  if (fit.ranks == 0) {
    d.reason = absl::StrCat("runs at ", size, " of ", full, " ranks: no larger layout runs (",
                            fit.last_error, ")");
    return d;
  }
  d.action = ElasticAction::kResize;
  d.ranks = fit.ranks;
  d.reason = absl::StrCat(kGrows, DescribeSize(current), " to ", DescribeSize(fit.spec),
                          ": ", available_ranks - size, " more ranks' devices available");
  d.spec = std::move(fit.spec);
  return d;
}

}  // namespace loom::coordinator
