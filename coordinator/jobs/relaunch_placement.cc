#include "coordinator/jobs/relaunch_placement.h"

#include <algorithm>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/rank_list.h"

namespace loom::coordinator {
namespace {

// What a node offers the relaunch.
struct Room {
  std::string node_id;
  std::vector<int64_t> free;  // in the order to use them
  bool cordoned = false;
  bool avoided = false;  // failed the job
  bool spare = true;     // runs no rank of the job (besides relaunched ones)
  bool used = false;     // this relaunch put a rank here
  std::string nvlink_domain;
  int tier() const { return avoided ? 2 : spare ? 0 : 1; }
};

bool Take(std::vector<int64_t>& free, int64_t device) {
  auto it = std::find(free.begin(), free.end(), device);
  if (it == free.end()) return false;
  free.erase(it);
  return true;
}

// The room to move a unit of `need` ranks to, or nullptr: the best tier, then
// a node already used, then the best fit for all `remaining`, then the largest.
// With a domain: only that NVLink domain's nodes.
Room* Choose(std::vector<Room>& rooms, int64_t need, int64_t remaining,
             const std::string& domain = "") {
  Room* best = nullptr;
  auto better = [&](const Room& a, const Room& b) {
    if (a.tier() != b.tier()) return a.tier() < b.tier();
    if (a.used != b.used) return a.used;
    const int64_t fa = static_cast<int64_t>(a.free.size());
    const int64_t fb = static_cast<int64_t>(b.free.size());
    const bool a_fits = fa >= remaining;
    const bool b_fits = fb >= remaining;
    if (a_fits != b_fits) return a_fits;
    if (a_fits) return fa < fb;  // best fit
    return fa > fb;              // else the most room
  };
  for (Room& room : rooms) {
    if (room.cordoned || static_cast<int64_t>(room.free.size()) < need) continue;
    if (!domain.empty() && room.nvlink_domain != domain) continue;
    if (best == nullptr || better(room, *best)) best = &room;  // ties: the first given
  }
  return best;
}

// Why a failed rank cannot go back to its own place (room: its node's, if live).
std::string WhyNotInPlace(const topology::DeviceSlot& slot, const Room* room, bool lost) {
  if (lost) return absl::StrCat("its node ", slot.node_id, " was lost");
  if (room == nullptr) return absl::StrCat("its node ", slot.node_id, " is not live");
  if (room->cordoned) return absl::StrCat("its node ", slot.node_id, " is cordoned");
  return absl::StrCat("its device ", slot.local_device, " on node ", slot.node_id, " is not free");
}

}  // namespace

RelaunchPlacement PlaceRelaunchedRanks(const RelaunchPlacementRequest& request) {
  RelaunchPlacement out;
  out.slots = request.placement;
  const int64_t world = static_cast<int64_t>(request.placement.size());
  std::vector<Room> rooms;
  std::map<std::string, size_t> index;
  for (const RelaunchNode& node : request.nodes) {
    if (request.lost_nodes.count(node.node_id) > 0 || index.count(node.node_id) > 0) continue;
    index[node.node_id] = rooms.size();
    rooms.push_back(Room{.node_id = node.node_id,
                         .free = node.free_devices,
                         .cordoned = node.cordoned,
                         .avoided = request.avoid.count(node.node_id) > 0,
                         .nvlink_domain = node.nvlink_domain});
  }
  auto room_of = [&](const std::string& node) -> Room* {
    auto it = index.find(node);
    return it == index.end() ? nullptr : &rooms[it->second];
  };
  // The survivors keep their devices.
  for (int64_t r = 0; r < world; ++r) {
    if (request.failed.count(r) > 0) continue;
    if (Room* room = room_of(request.placement[r].node_id)) {
      Take(room->free, request.placement[r].local_device);
      room->spare = false;
    }
  }
  // 1. Back in its own place where that is possible.
  std::vector<int64_t> moving;
  std::map<int64_t, std::string> why_not_in_place;
  for (int64_t r : request.failed) {
    const topology::DeviceSlot& slot = request.placement[r];
    Room* room = room_of(slot.node_id);
    if (room != nullptr && !room->cordoned && Take(room->free, slot.local_device)) {
      room->spare = false;
      continue;
    }
    moving.push_back(r);
    why_not_in_place[r] = WhyNotInPlace(slot, room, request.lost_nodes.count(slot.node_id) > 0);
  }
  // 2. The rest move, a TP group's moving ranks together.
  std::map<int64_t, std::vector<int64_t>> units;  // TP group -> its moving ranks
  for (int64_t r : moving) units[r / request.tp].push_back(r);
  int64_t remaining = 0;  // ranks still to move that are free to go anywhere
  std::map<int64_t, std::optional<int64_t>> peer_of_unit;
  const std::set<int64_t> moving_set(moving.begin(), moving.end());
  for (const auto& [group, ranks] : units) {
    std::optional<int64_t> peer;
    for (int64_t r = group * request.tp; r < (group + 1) * request.tp; ++r) {
      if (moving_set.count(r) == 0) {
        peer = r;
        break;
      }
    }
    peer_of_unit[group] = peer;
    if (!peer) remaining += static_cast<int64_t>(ranks.size());
  }
  for (const auto& [group, ranks] : units) {
    const int64_t need = static_cast<int64_t>(ranks.size());
    const std::string which = absl::StrCat(need == 1 ? "rank " : "ranks ", RankList(ranks));
    Room* room = nullptr;
    if (const std::optional<int64_t> peer = peer_of_unit[group]) {
      // The rest of its TP group lives on: the group stays on one node.
      const std::string& node = out.slots[*peer].node_id;
      room = room_of(node);
      if (room != nullptr && !room->nvlink_domain.empty() &&
          (room->cordoned || static_cast<int64_t>(room->free.size()) < need)) {
        // Its NVLink domain's other nodes may hold the group's moving part.
        if (Room* other = Choose(rooms, need, need, room->nvlink_domain)) room = other;
      }
      if (room == nullptr || room->cordoned || static_cast<int64_t>(room->free.size()) < need) {
        out.error = absl::StrCat(
            "no place to relaunch ", which, " (", why_not_in_place[ranks.front()],
            "): the rest of its TP group runs on node ", node, ", which ",
            room == nullptr  ? "is not live"
            : room->cordoned ? "is cordoned"
                             : absl::StrCat("has ", room->free.size(), " free device(s)"),
            ", and a TP group stays on one node (or one nvlink_domain)");
        return out;
      }
    } else {
      room = Choose(rooms, need, remaining);
      if (room == nullptr) {
        out.error = absl::StrCat("no live node of the job's device kind has ",
                                 need == 1 ? "a free device" : absl::StrCat(need, " free devices"),
                                 " to relaunch ", which, " (", why_not_in_place[ranks.front()],
                                 need > 1 ? "; a TP group stays on one node" : "", ")");
        return out;
      }
      remaining -= need;
    }
    for (int64_t r : ranks) {
      out.slots[r] = topology::DeviceSlot{room->node_id, room->free.front()};
      room->free.erase(room->free.begin());
    }
    room->used = true;
  }
  return out;
}

}  // namespace loom::coordinator
