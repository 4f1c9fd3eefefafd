// One attempt of a job's ranks as threads of the test: every rank builds its
// groups over one InProcessStore as the trainer does (attempt_groups.h): the
// groups of its place in the mesh (common/topology/mesh.h, the coordinator's
// rank order) in the order tp, dp, pp, cp, dp_cp, ep, then its snapshot pair
// groups, all Gloo over loopback in the attempt's own namespace. A new
// attempt builds new groups in a new namespace, as after a failure.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/spec/job_spec.h"
#include "common/topology/mesh.h"
#include "common/topology/snapshot_ring.h"
#include "gtest/gtest.h"
#include "worker/comm/group_factory.h"
#include "worker/comm/in_process_store.h"
#include "worker/comm/pair_groups.h"
#include "worker/comm/prefix_store.h"
#include "worker/engine/parallel/parallel_context.h"

namespace loom::engine::testing {

struct MeshLayout {
  int pp = 1, dp = 1, ep = 1, cp = 1, tp = 1;
  int zero = 0;
  spec::Schedule schedule = spec::Schedule::k1F1B;
  int virtual_stages = 1;
  bool sequence_parallel = false;

  int world() const { return pp * dp * ep * cp * tp; }
  spec::Layout AsLayout() const {
    spec::Layout l;
    l.pp = pp;
    l.dp = dp;
    l.ep = ep;
    l.cp = cp;
    l.tp = tp;
    return l;
  }
  void ApplyTo(spec::JobSpec* job) const {
    job->parallelism.pp = pp;
    job->parallelism.dp = dp;
    job->parallelism.ep = ep;
    job->parallelism.cp = cp;
    job->parallelism.tp = tp;
    job->parallelism.zero_stage = zero;
    job->parallelism.schedule = schedule;
    job->parallelism.virtual_stages = virtual_stages;
    job->parallelism.sequence_parallel = sequence_parallel;
  }
};

// The buddy of every rank placed node by node (ranks_per_node[i] consecutive
// ranks on node i), by the coordinator's rule (common/topology/snapshot_ring.h).
inline std::vector<int> NodeRing(const std::vector<int>& ranks_per_node) {
  std::vector<topology::DeviceSlot> slots;
  for (size_t n = 0; n < ranks_per_node.size(); ++n) {
    for (int d = 0; d < ranks_per_node[n]; ++d) slots.push_back({"node-" + std::to_string(n), d});
  }
  const topology::SnapshotRing ring = topology::BuildSnapshotRing(slots);
  return std::vector<int>(ring.buddy.begin(), ring.buddy.end());
}

// body(rank) on one thread per rank; returns when all have.
inline void RunRanks(int n, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&body, r] { body(r); });
  for (std::thread& t : threads) t.join();
}

class MeshAttempt {
 public:
  // pair_peers(rank): the ranks it shares a pair group with in this attempt.
  MeshAttempt(comm::InProcessStore& store, const std::string& ns, const MeshLayout& layout,
              const std::function<std::vector<int>(int)>& pair_peers,
              absl::Duration timeout = absl::Seconds(60))
      : layout_(layout), ranks_(static_cast<size_t>(layout.world())) {
    absl::StatusOr<topology::RankMesh> mesh = topology::RankMesh::Create(layout.AsLayout());
    EXPECT_TRUE(mesh.ok()) << mesh.status();
    RunRanks(layout.world(), [&](int r) {
      comm::PrefixStore view(store, ns);
      Rank& me = ranks_[static_cast<size_t>(r)];
      absl::StatusOr<topology::RankGroups> groups = mesh->GroupsOf(r);
      ASSERT_TRUE(groups.ok()) << groups.status();
      auto make = [&](const std::string& axis, const std::vector<int64_t>& members64,
                      comm::Communicator** slot) {
        const std::vector<int> members(members64.begin(), members64.end());
        if (members.size() <= 1) return;
        auto made = comm::CreateGroupCommunicator(view, "", axis, members, r, timeout);
        ASSERT_TRUE(made.ok()) << made.status();
        *slot = made->get();
        me.owned.push_back(std::move(*made));
      };
      make("tp", groups->tp, &me.tp);
      make("dp", groups->dp, &me.dp);
      make("pp", groups->pp, &me.pp);
      make("cp", groups->cp, &me.cp);
      if (me.cp != nullptr) make("dp_cp", groups->dp_cp, &me.dp_cp);
      make("ep", groups->ep, &me.ep);
      comm::PairGroupOptions options;
      options.timeout = timeout;
      auto pairs = comm::CreatePairGroups(view, r, pair_peers(r), options);
      ASSERT_TRUE(pairs.ok()) << pairs.status();
      for (auto& [peer, group] : *pairs) {
        me.pairs[peer] = group.get();
        me.owned.push_back(std::move(group));
      }
      absl::StatusOr<topology::MeshCoord> coord = mesh->CoordOf(r);
      ASSERT_TRUE(coord.ok());
      me.dp_rank = static_cast<int>(coord->dp);
    });
  }

  ParallelContext Context(int rank) const {
    const Rank& me = ranks_[static_cast<size_t>(rank)];
    absl::StatusOr<ParallelContext> ctx =
        ParallelContext::Make(me.dp_rank, layout_.dp, me.dp, me.tp, me.pp, me.cp, me.dp_cp, me.ep);
    EXPECT_TRUE(ctx.ok()) << ctx.status();
    return ctx.ok() ? *ctx : ParallelContext{};
  }
  comm::Communicator* Pair(int rank, int peer) const {
    const auto& pairs = ranks_[static_cast<size_t>(rank)].pairs;
    auto it = pairs.find(peer);
    return it == pairs.end() ? nullptr : it->second;
  }

 private:
  struct Rank {
    comm::Communicator *tp = nullptr, *dp = nullptr, *pp = nullptr, *cp = nullptr, *dp_cp = nullptr,
                       *ep = nullptr;
    std::map<int, comm::Communicator*> pairs;
    int dp_rank = 0;
    std::vector<std::unique_ptr<comm::Communicator>> owned;
  };
  MeshLayout layout_;
  std::vector<Rank> ranks_;
};

}  // namespace loom::engine::testing
