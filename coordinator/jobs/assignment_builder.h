// Builds each rank's assignment for one attempt of a job: mesh coordinates,
// group members, node and device, rendezvous namespace. Pure: the scheduler
// calls it with a placement and sends the results to the agents.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "coordinator/jobs/layout_proto.h"
#include "common/topology/placement.h"
#include "loom/v1/rank.pb.h"

namespace loom::coordinator {

struct AttemptContext {
  std::string job_id;
  int32_t attempt = 1;
  std::string resolved_spec_yaml;
  std::string checkpoint_dir;  // <checkpoint_root>/<owner>/<job_id>; empty: no checkpoints
  std::string data_dir;        // the first data root
  double collective_timeout_s = 60;
  // The attempt's rendezvous namespace; empty: StoreNamespace(job_id, attempt).
  std::string store_namespace;
  std::string owner;
  std::string resume_from_job;  // checkpoint.resume_from, and its directory
  std::string resume_from_dir;
  // The job's uid and the resume_from job's (Job.run_uid); 0: none.
  uint32_t run_uid = 0;
  uint32_t resume_from_uid = 0;
};

// The readable part of an attempt's rendezvous namespace: "job-000007/attempt-3".
std::string StoreNamespace(const std::string& job_id, int32_t attempt);
// StoreNamespace plus 128 random bits, so that no one can read or write a
// namespace without having been told its name (it travels only in the
// attempt's assignments).
std::string NewStoreNamespace(const std::string& job_id, int32_t attempt);

// Before anything is built: RESOURCE_EXHAUSTED when every rank's launch
// message would be above `max_launch_bytes` whatever the rest holds. A stage's
// pipeline instructions hold a forward and a backward per micro-batch and
// chunk, at least two bytes each with its separator, so a spec of millions of
// micro-batches (a huge global batch over micro-batches of one) is refused
// from its numbers alone, in O(1), instead of after its schedules and every
// rank's copy of them were built (gigabytes). What passes is then built with
// work bounded by a constant times max_launch_bytes per stage, and checked
// exactly per rank.
absl::Status CheckLaunchSizeLowerBound(const spec::JobSpec& spec, int64_t max_launch_bytes);

absl::StatusOr<std::vector<loom::v1::RankAssignment>> BuildAssignments(
    const spec::JobSpec& spec, const topology::Placement& placement, const AttemptContext& context,
    const std::map<std::string, std::string>& node_addresses);

}  // namespace loom::coordinator
