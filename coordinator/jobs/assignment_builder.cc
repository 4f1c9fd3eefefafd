#include "coordinator/jobs/assignment_builder.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/spec/layout.h"
#include "common/topology/instruction.h"
#include "common/topology/job_plan.h"
#include "common/topology/mesh.h"
#include "proto/group_members.h"

namespace loom::coordinator {

std::string StoreNamespace(const std::string& job_id, int32_t attempt) {
  return absl::StrCat(job_id, "/attempt-", attempt);
}

std::string NewStoreNamespace(const std::string& job_id, int32_t attempt) {
  std::random_device random;  // the kernel's generator, not a seeded PRNG
  std::string suffix;
  for (int i = 0; i < 4; ++i) absl::StrAppend(&suffix, absl::Hex(random(), absl::kZeroPad8));
  return absl::StrCat(StoreNamespace(job_id, attempt), "-", suffix);
}

namespace {

// The groups of every assignment, in this order (topology::RankGroups).
struct GroupKind {
  const char* axis;
  topology::AxisSet axes;
};
const GroupKind kGroupKinds[] = {
    {"tp", {topology::Axis::kTp}},
    {"cp", {topology::Axis::kCp}},
    {"ep", {topology::Axis::kEp}},
    {"dp", {topology::Axis::kDp}},
    {"pp", {topology::Axis::kPp}},
    {"dp_cp", {topology::Axis::kDp, topology::Axis::kCp}},
    {"dp_ep_cp", {topology::Axis::kDp, topology::Axis::kEp, topology::Axis::kCp}},
    {"tp_cp", {topology::Axis::kTp, topology::Axis::kCp}},
    {"model", {topology::Axis::kTp, topology::Axis::kPp}},
};

}  // namespace

absl::Status CheckLaunchSizeLowerBound(const spec::JobSpec& spec, int64_t max_launch_bytes) {
  const spec::Layout layout = spec::LayoutOf(spec);
  if (layout.pp <= 1 || max_launch_bytes <= 0) return absl::OkStatus();
  // Spec limits keep each factor below 2^24 and 2^10: no overflow.
  const int64_t instructions = 2 * layout.grad_accum * std::max<int64_t>(layout.virtual_stages, 1);
  const int64_t at_least = 2 * instructions;
  if (at_least <= max_launch_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "the launch message of every rank would be at least ", at_least,
      " bytes (pipeline instructions for ", layout.grad_accum,
      " micro-batches per step: train.global_batch_size / (dp * ep * train.micro_batch_size)), "
      "above the transport limit of ", max_launch_bytes,
      " bytes (a larger train.micro_batch_size or a smaller train.global_batch_size makes it "
      "smaller)"));
}

absl::StatusOr<std::vector<loom::v1::RankAssignment>> BuildAssignments(
    const spec::JobSpec& spec, const topology::Placement& placement,
    const AttemptContext& context, const std::map<std::string, std::string>& node_addresses) {
  // The plan the trainer derives from the same spec with the same function
  // (worker/engine/pipeline_parallel/pipeline_plan.h checks they agree).
  absl::StatusOr<topology::JobPlan> plan = topology::DeriveJobPlan(spec);
  if (!plan.ok()) return plan.status();
  absl::StatusOr<topology::RankMesh> mesh = topology::RankMesh::Create(plan->layout);
  if (!mesh.ok()) return mesh.status();
  if (static_cast<int64_t>(placement.slots.size()) != mesh->world_size()) {
    return absl::InternalError(absl::StrCat("placement has ", placement.slots.size(),
                                            " slots for a world of ", mesh->world_size()));
  }
  const loom::v1::Layout layout = LayoutToProto(plan->layout);
  // Every rank of a group carries the same members: each group is built and
  // encoded once, found again by its lowest coordinates (the group's axes set
  // to 0). Building it per rank cost world x group size (a sort of 16,384
  // ranks for each of 16,384 ranks, three times over: 20 s of placement).
  std::vector<std::map<int64_t, loom::v1::GroupMembers>> built(std::size(kGroupKinds));
  auto add_groups = [&](loom::v1::RankAssignment& a, int64_t rank,
                        const topology::MeshCoord& coord) -> absl::Status {
    for (size_t k = 0; k < std::size(kGroupKinds); ++k) {
      topology::MeshCoord origin = coord;
      for (topology::Axis axis : {topology::Axis::kPp, topology::Axis::kDp, topology::Axis::kEp,
                                  topology::Axis::kCp, topology::Axis::kTp}) {
        if (kGroupKinds[k].axes.Contains(axis)) origin.Set(axis, 0);
      }
      absl::StatusOr<int64_t> key = mesh->RankOf(origin);
      if (!key.ok()) return key.status();
      auto it = built[k].find(*key);
      if (it == built[k].end()) {
        absl::StatusOr<std::vector<int64_t>> members = mesh->GroupOf(rank, kGroupKinds[k].axes);
        if (!members.ok()) return members.status();
        loom::v1::GroupMembers group;
        group.set_axis(kGroupKinds[k].axis);
        proto::SetGroupMembers(*members, &group);
        it = built[k].emplace(*key, std::move(group)).first;
      }
      *a.add_groups() = it->second;
    }
    return absl::OkStatus();
  };
  std::map<int64_t, std::string> stage_instructions;  // by pipeline stage
  std::vector<loom::v1::RankAssignment> assignments;
  assignments.reserve(static_cast<size_t>(mesh->world_size()));
  for (int64_t rank = 0; rank < mesh->world_size(); ++rank) {
    absl::StatusOr<topology::MeshCoord> coord = mesh->CoordOf(rank);
    absl::StatusOr<std::string> place = mesh->PlaceString(rank);
    if (!coord.ok()) return coord.status();
    if (!place.ok()) return place.status();

    loom::v1::RankAssignment a;
    a.set_job_id(context.job_id);
    a.set_attempt(context.attempt);
    a.set_rank(static_cast<int32_t>(rank));
    a.set_world_size(static_cast<int32_t>(mesh->world_size()));
    a.set_spec_yaml(context.resolved_spec_yaml);
    *a.mutable_layout() = layout;
    a.mutable_coords()->set_pp(coord->pp);
    a.mutable_coords()->set_dp(coord->dp);
    a.mutable_coords()->set_ep(coord->ep);
    a.mutable_coords()->set_cp(coord->cp);
    a.mutable_coords()->set_tp(coord->tp);
    if (absl::Status s = add_groups(a, rank, *coord); !s.ok()) return s;
    a.set_node_id(placement.slots[rank].node_id);
    a.set_local_device(static_cast<int32_t>(placement.slots[rank].local_device));
    a.set_store_namespace(context.store_namespace.empty()
                              ? StoreNamespace(context.job_id, context.attempt)
                              : context.store_namespace);
    a.set_place(*place);
    for (int64_t layer : plan->LayersOf(coord->pp)) a.add_layers(static_cast<int32_t>(layer));
    if (plan->pipelined()) {
      // Formatted once per stage: every rank of a stage runs the same list.
      std::string& text = stage_instructions[coord->pp];
      if (text.empty()) text = topology::FormatInstructions(plan->InstructionsOf(coord->pp));
      a.set_pipeline_instructions(text);
      a.set_pipeline_bubble_fraction(plan->bubble_fraction);
    }
    a.set_checkpoint_dir(context.checkpoint_dir);
    a.set_data_dir(context.data_dir);
    a.set_owner(context.owner);
    a.set_resume_from_job(context.resume_from_job);
    a.set_resume_from_dir(context.resume_from_dir);
    a.set_run_uid(context.run_uid);
    a.set_resume_from_uid(context.resume_from_uid);
    a.set_collective_timeout_s(context.collective_timeout_s);
    auto address = node_addresses.find(a.node_id());
    a.set_node_address(address == node_addresses.end() || address->second.empty() ? "127.0.0.1"
                                                                                  : address->second);
    assignments.push_back(std::move(a));
  }
  return assignments;
}

}  // namespace loom::coordinator
