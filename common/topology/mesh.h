// The rank mesh: how a job's global ranks map onto the five parallel axes
// (pp, dp, ep, cp, tp) and which ranks form each communication group.
//
// Layout: tp varies fastest, then cp, ep, dp, and pp slowest, so
//   rank = ((((pp_i * dp + dp_i) * ep + ep_i) * cp + cp_i) * tp + tp_i).
// A TP group is therefore a run of tp consecutive ranks, which lets placement
// keep it inside one node. Pure logic, no I/O.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/spec/layout.h"

namespace loom::topology {

// Axes in mesh order, slowest first; the enum value is the axis' position.
enum class Axis { kPp = 0, kDp = 1, kEp = 2, kCp = 3, kTp = 4 };
inline constexpr int kNumAxes = 5;
inline constexpr std::array<Axis, kNumAxes> kAllAxes = {Axis::kPp, Axis::kDp, Axis::kEp,
                                                        Axis::kCp, Axis::kTp};

// "pp", "dp", "ep", "cp", "tp".
const char* AxisName(Axis axis);

// A mesh's shape is the job's layout (common/spec/layout.h): RankMesh reads
// its five axes and nothing else.
using MeshShape = spec::Layout;

// The size of `axis` in `shape`.
int64_t AxisSize(const MeshShape& shape, Axis axis);

// 0-based coordinates of one rank on each axis.
struct MeshCoord {
  int64_t pp = 0;
  int64_t dp = 0;
  int64_t ep = 0;
  int64_t cp = 0;
  int64_t tp = 0;

  int64_t Get(Axis axis) const;
  void Set(Axis axis, int64_t value);
  bool operator==(const MeshCoord&) const = default;
};

// A set of axes, e.g. {Axis::kDp, Axis::kCp} for the gradient-reduction group.
class AxisSet {
 public:
  AxisSet() = default;
  AxisSet(std::initializer_list<Axis> axes);
  bool Contains(Axis axis) const { return (bits_ >> static_cast<int>(axis)) & 1u; }
  AxisSet With(Axis axis) const;
  bool empty() const { return bits_ == 0; }
  // "dp*cp" style, in mesh order; "none" when empty.
  std::string ToString() const;
  bool operator==(const AxisSet&) const = default;

 private:
  unsigned bits_ = 0;
};

// The groups a rank belongs to, each as ascending global ranks. A rank's index
// in a list is its rank inside that group (ascending global rank equals
// lexicographic order of the group's axis coordinates, slowest axis first).
struct RankGroups {
  std::vector<int64_t> tp;
  std::vector<int64_t> cp;
  std::vector<int64_t> ep;
  std::vector<int64_t> dp;
  std::vector<int64_t> pp;        // index = pipeline stage
  std::vector<int64_t> dp_cp;     // expert-parameter gradients (and all gradients when ep == 1)
  std::vector<int64_t> dp_ep_cp;  // dense-parameter gradients: every rank that sees other tokens
  std::vector<int64_t> tp_cp;     // ranks that share one model shard's sequence work
  std::vector<int64_t> model;     // tp×pp: one full model replica's shards (Megatron's MP group)
};

class RankMesh {
 public:
  // Every axis size must be >= 1.
  static absl::StatusOr<RankMesh> Create(const MeshShape& shape);

  const MeshShape& shape() const { return shape_; }
  int64_t world_size() const { return shape_.world(); }

  absl::StatusOr<MeshCoord> CoordOf(int64_t rank) const;
  absl::StatusOr<int64_t> RankOf(const MeshCoord& coord) const;

  // The ranks that share `rank`'s coordinates on every axis outside `axes`,
  // ascending. An empty set gives {rank}; all axes give the whole world.
  absl::StatusOr<std::vector<int64_t>> GroupOf(int64_t rank, AxisSet axes) const;
  // Every group over `axes`, each ascending, ordered by first member; together
  // they partition the world.
  std::vector<std::vector<int64_t>> AllGroups(AxisSet axes) const;

  absl::StatusOr<RankGroups> GroupsOf(int64_t rank) const;

  // "TP(1)-CP(0)-PP(1)-DP(0)-Rank(3)": each axis' 0-based coordinate of this
  // rank, then the global rank. EP(i) is inserted after CP when ep > 1.
  absl::StatusOr<std::string> PlaceString(int64_t rank) const;

 private:
  explicit RankMesh(const MeshShape& shape);
  MeshCoord CoordOfUnchecked(int64_t rank) const;
  int64_t RankOfUnchecked(const MeshCoord& coord) const;
  std::vector<int64_t> GroupOfUnchecked(int64_t rank, AxisSet axes) const;

  MeshShape shape_;
  std::array<int64_t, kNumAxes> stride_{};  // rank distance of one step along each axis
};

}  // namespace loom::topology
