// A job's whole rank layout in one call: mesh, placement, stage partition and
// pipeline schedule, turned into each rank's assignment (what the coordinator
// sends a rank so that it needs nothing else from coordinator code).
// Pure logic, no I/O.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/topology/instruction.h"
#include "common/topology/mesh.h"
#include "common/topology/placement.h"
#include "common/topology/schedule.h"
#include "common/topology/stage_partition.h"

namespace loom::topology {

struct LayoutRequest {
  MeshShape shape;
  // Placement.
  std::vector<NodeDevices> nodes;
  std::set<std::string> avoid;
  // Stage partition over shape.pp * virtual_stages chunks.
  int64_t num_layers = 0;
  ModelDims dims;                     // derives the end costs unless end_costs is set
  std::optional<EndCosts> end_costs;  // layer-equivalents
  std::vector<double> layer_costs;    // optional, one per layer
  // Schedule.
  ScheduleKind schedule = ScheduleKind::k1F1B;
  int64_t virtual_stages = 1;
  int64_t microbatches = 1;  // per optimizer step on each data shard
};

struct RankAssignment {
  int64_t rank = 0;
  MeshCoord coord;
  std::string place;  // RankMesh::PlaceString
  DeviceSlot device;
  RankGroups groups;  // groups.pp[s] is the global rank of pipeline stage s
  int64_t stage = 0;  // == coord.pp
  std::vector<ModelChunk> chunks;  // this stage's chunks, in chunk order
  std::vector<Instruction> instructions;
};

struct Layout {
  MeshShape shape;
  Placement placement;
  StagePartition partition;
  PipelineSchedule schedule;
  double bubble_fraction = 0;  // simulated, unit costs (forward 1, backward 2)
  std::vector<RankAssignment> ranks;  // index = global rank
};

// Fails with the first failing part's error (mesh, partition, schedule,
// placement), each naming its field and rule.
absl::StatusOr<Layout> BuildLayout(const LayoutRequest& request);

}  // namespace loom::topology
