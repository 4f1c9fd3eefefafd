#include "coordinator/jobs/assignment_builder.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/topology/instruction.h"
#include "common/topology/job_plan.h"
#include "common/topology/mesh.h"

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

void AddGroup(loom::v1::RankAssignment& a, const char* axis, const std::vector<int64_t>& ranks) {
  loom::v1::GroupMembers* group = a.add_groups();
  group->set_axis(axis);
  for (int64_t r : ranks) group->add_ranks(static_cast<int32_t>(r));
}

}  // namespace

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
  std::vector<loom::v1::RankAssignment> assignments;
  for (int64_t rank = 0; rank < mesh->world_size(); ++rank) {
    absl::StatusOr<topology::MeshCoord> coord = mesh->CoordOf(rank);
    absl::StatusOr<topology::RankGroups> groups = mesh->GroupsOf(rank);
    absl::StatusOr<std::string> place = mesh->PlaceString(rank);
    if (!coord.ok()) return coord.status();
    if (!groups.ok()) return groups.status();
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
    AddGroup(a, "tp", groups->tp);
    AddGroup(a, "cp", groups->cp);
    AddGroup(a, "ep", groups->ep);
    AddGroup(a, "dp", groups->dp);
    AddGroup(a, "pp", groups->pp);
    AddGroup(a, "dp_cp", groups->dp_cp);
    AddGroup(a, "dp_ep_cp", groups->dp_ep_cp);
    AddGroup(a, "tp_cp", groups->tp_cp);
    AddGroup(a, "model", groups->model);
    a.set_node_id(placement.slots[rank].node_id);
    a.set_local_device(static_cast<int32_t>(placement.slots[rank].local_device));
    a.set_store_namespace(context.store_namespace.empty()
                              ? StoreNamespace(context.job_id, context.attempt)
                              : context.store_namespace);
    a.set_place(*place);
    for (int64_t layer : plan->LayersOf(coord->pp)) a.add_layers(static_cast<int32_t>(layer));
    if (plan->pipelined()) {
      a.set_pipeline_instructions(topology::FormatInstructions(plan->InstructionsOf(coord->pp)));
      a.set_pipeline_bubble_fraction(plan->bubble_fraction);
    }
    a.set_checkpoint_dir(context.checkpoint_dir);
    a.set_data_dir(context.data_dir);
    a.set_owner(context.owner);
    a.set_resume_from_job(context.resume_from_job);
    a.set_resume_from_dir(context.resume_from_dir);
    a.set_collective_timeout_s(context.collective_timeout_s);
    auto address = node_addresses.find(a.node_id());
    a.set_node_address(address == node_addresses.end() || address->second.empty() ? "127.0.0.1"
                                                                                  : address->second);
    assignments.push_back(std::move(a));
  }
  return assignments;
}

}  // namespace loom::coordinator
