#include "common/topology/mesh.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace loom::topology {

const char* AxisName(Axis axis) {
  switch (axis) {
    case Axis::kPp: return "pp";
    case Axis::kDp: return "dp";
    case Axis::kEp: return "ep";
    case Axis::kCp: return "cp";
    case Axis::kTp: return "tp";
  }
  return "?";
}

namespace {

// The field of a shape or coordinate that holds `axis` (both name them alike).
template <typename PerAxis>
auto& AxisField(PerAxis& x, Axis axis) {
  switch (axis) {
    case Axis::kPp: return x.pp;
    case Axis::kDp: return x.dp;
    case Axis::kEp: return x.ep;
    case Axis::kCp: return x.cp;
    case Axis::kTp: break;
  }
  return x.tp;
}

}  // namespace

int64_t AxisSize(const MeshShape& shape, Axis axis) { return AxisField(shape, axis); }

int64_t MeshCoord::Get(Axis axis) const { return AxisField(*this, axis); }

void MeshCoord::Set(Axis axis, int64_t value) { AxisField(*this, axis) = value; }

AxisSet::AxisSet(std::initializer_list<Axis> axes) {
  for (Axis a : axes) bits_ |= 1u << static_cast<int>(a);
}

AxisSet AxisSet::With(Axis axis) const {
  AxisSet out = *this;
  out.bits_ |= 1u << static_cast<int>(axis);
  return out;
}

std::string AxisSet::ToString() const {
  std::vector<std::string> names;
  for (Axis a : kAllAxes) {
    if (Contains(a)) names.push_back(AxisName(a));
  }
  return names.empty() ? "none" : absl::StrJoin(names, "*");
}

RankMesh::RankMesh(const MeshShape& shape) : shape_(shape) {
  int64_t stride = 1;
  for (int i = kNumAxes - 1; i >= 0; --i) {
    stride_[i] = stride;
    stride *= AxisSize(shape_, kAllAxes[i]);
  }
}

absl::StatusOr<RankMesh> RankMesh::Create(const MeshShape& shape) {
  for (Axis a : kAllAxes) {
    if (AxisSize(shape, a) < 1) {
      return absl::InvalidArgumentError(absl::StrCat("mesh axis ", AxisName(a), "=",
                                                     AxisSize(shape, a), " must be >= 1"));
    }
  }
  return RankMesh(shape);
}

MeshCoord RankMesh::CoordOfUnchecked(int64_t rank) const {
  MeshCoord c;
  for (int i = 0; i < kNumAxes; ++i) {
    c.Set(kAllAxes[i], (rank / stride_[i]) % AxisSize(shape_, kAllAxes[i]));
  }
  return c;
}

int64_t RankMesh::RankOfUnchecked(const MeshCoord& coord) const {
  int64_t rank = 0;
  for (int i = 0; i < kNumAxes; ++i) rank += coord.Get(kAllAxes[i]) * stride_[i];
  return rank;
}

absl::StatusOr<MeshCoord> RankMesh::CoordOf(int64_t rank) const {
  if (rank < 0 || rank >= world_size()) {
    return absl::OutOfRangeError(
        absl::StrCat("rank ", rank, " is outside the world [0, ", world_size(), ")"));
  }
  return CoordOfUnchecked(rank);
}

absl::StatusOr<int64_t> RankMesh::RankOf(const MeshCoord& coord) const {
  for (Axis a : kAllAxes) {
    if (coord.Get(a) < 0 || coord.Get(a) >= AxisSize(shape_, a)) {
      return absl::OutOfRangeError(absl::StrCat("coordinate ", AxisName(a), "=", coord.Get(a),
                                                " is outside [0, ", AxisSize(shape_, a), ")"));
    }
  }
  return RankOfUnchecked(coord);
}

std::vector<int64_t> RankMesh::GroupOfUnchecked(int64_t rank, AxisSet axes) const {
  // Zero the group's axes to find its first member, then enumerate the
  // group's sub-mesh in mesh order, which yields ascending ranks.
  MeshCoord base = CoordOfUnchecked(rank);
  std::vector<Axis> free_axes;
  for (Axis a : kAllAxes) {
    if (axes.Contains(a)) {
      base.Set(a, 0);
      free_axes.push_back(a);
    }
  }
  const int64_t origin = RankOfUnchecked(base);
  std::vector<int64_t> members = {origin};
  for (Axis a : free_axes) {  // slowest first; expand like an odometer
    const int64_t stride = stride_[static_cast<int>(a)];
    std::vector<int64_t> next;
    next.reserve(members.size() * AxisSize(shape_, a));
    for (int64_t m : members) {
      for (int64_t i = 0; i < AxisSize(shape_, a); ++i) next.push_back(m + i * stride);
    }
    members = std::move(next);
  }
  std::sort(members.begin(), members.end());
  return members;
}

absl::StatusOr<std::vector<int64_t>> RankMesh::GroupOf(int64_t rank, AxisSet axes) const {
  if (rank < 0 || rank >= world_size()) {
    return absl::OutOfRangeError(
        absl::StrCat("rank ", rank, " is outside the world [0, ", world_size(), ")"));
  }
  return GroupOfUnchecked(rank, axes);
}

std::vector<std::vector<int64_t>> RankMesh::AllGroups(AxisSet axes) const {
  std::vector<std::vector<int64_t>> groups;
  std::vector<bool> seen(world_size(), false);
  for (int64_t r = 0; r < world_size(); ++r) {
    if (seen[r]) continue;
    std::vector<int64_t> g = GroupOfUnchecked(r, axes);
    for (int64_t m : g) seen[m] = true;
    groups.push_back(std::move(g));
  }
  return groups;
}

absl::StatusOr<RankGroups> RankMesh::GroupsOf(int64_t rank) const {
  if (rank < 0 || rank >= world_size()) {
    return absl::OutOfRangeError(
        absl::StrCat("rank ", rank, " is outside the world [0, ", world_size(), ")"));
  }
  RankGroups g;
  g.tp = GroupOfUnchecked(rank, {Axis::kTp});
  g.cp = GroupOfUnchecked(rank, {Axis::kCp});
  g.ep = GroupOfUnchecked(rank, {Axis::kEp});
  g.dp = GroupOfUnchecked(rank, {Axis::kDp});
  g.pp = GroupOfUnchecked(rank, {Axis::kPp});
  g.dp_cp = GroupOfUnchecked(rank, {Axis::kDp, Axis::kCp});
  g.dp_ep_cp = GroupOfUnchecked(rank, {Axis::kDp, Axis::kEp, Axis::kCp});
  g.tp_cp = GroupOfUnchecked(rank, {Axis::kTp, Axis::kCp});
  g.model = GroupOfUnchecked(rank, {Axis::kTp, Axis::kPp});
  return g;
}

absl::StatusOr<std::string> RankMesh::PlaceString(int64_t rank) const {
  absl::StatusOr<MeshCoord> c = CoordOf(rank);
  if (!c.ok()) return c.status();
  std::string out = absl::StrCat("TP(", c->tp, ")-CP(", c->cp, ")");
  if (shape_.ep > 1) absl::StrAppend(&out, "-EP(", c->ep, ")");
  absl::StrAppend(&out, "-PP(", c->pp, ")-DP(", c->dp, ")-Rank(", rank, ")");
  return out;
}

}  // namespace loom::topology
