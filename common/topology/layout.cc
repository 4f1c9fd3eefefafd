#include "common/topology/layout.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/topology/simulator.h"

namespace loom::topology {

absl::StatusOr<Layout> BuildLayout(const LayoutRequest& request) {
  absl::StatusOr<RankMesh> mesh = RankMesh::Create(request.shape);
  if (!mesh.ok()) return mesh.status();

  PartitionRequest partition;
  partition.num_layers = request.num_layers;
  partition.pp = request.shape.pp;
  partition.virtual_stages = request.virtual_stages;
  partition.dims = request.dims;
  partition.end_costs = request.end_costs;
  partition.layer_costs = request.layer_costs;
  absl::StatusOr<StagePartition> stages = PartitionLayers(partition);
  if (!stages.ok()) return stages.status();

  absl::StatusOr<PipelineSchedule> schedule = BuildSchedule(
      {request.schedule, request.shape.pp, request.virtual_stages, request.microbatches});
  if (!schedule.ok()) return schedule.status();
  absl::StatusOr<SimReport> sim = Simulate(*schedule);
  if (!sim.ok()) return sim.status();
  if (sim->deadlocked) {
    return absl::InternalError(absl::StrCat("pipeline schedule deadlocks: ", sim->deadlock));
  }

  absl::StatusOr<Placement> placement =
      PlaceRanks({request.shape, request.nodes, request.avoid});
  if (!placement.ok()) return placement.status();

  Layout layout;
  layout.shape = request.shape;
  layout.bubble_fraction = sim->bubble_fraction;
  for (int64_t r = 0; r < mesh->world_size(); ++r) {
    RankAssignment a;
    a.rank = r;
    a.coord = *mesh->CoordOf(r);
    a.place = *mesh->PlaceString(r);
    a.device = placement->slots[r];
    a.groups = *mesh->GroupsOf(r);
    a.stage = a.coord.pp;
    a.chunks = stages->ChunksOfStage(a.stage);
    a.instructions = schedule->stages[a.stage];
    layout.ranks.push_back(std::move(a));
  }
  layout.placement = std::move(*placement);
  layout.partition = std::move(*stages);
  layout.schedule = std::move(*schedule);
  return layout;
}

}  // namespace loom::topology
