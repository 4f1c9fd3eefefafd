// The tp, dp and pp groups of a pp x dp x tp mesh whose ranks run as threads
// of the test (tp fastest: rank = (p * dp + d) * tp + t), each group Gloo over
// loopback in one InProcessStore. An axis of one rank has no group (nullptr),
// as the trainer passes it.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "tests/comm/rank_harness.h"

namespace loom::comm::testing {

class MeshGroups {
 public:
  MeshGroups(int pp, int dp, int tp, absl::Duration timeout = absl::Seconds(60))
      : pp_(pp), dp_(dp), tp_(tp) {
    // Keyed by the coordinates the group does not span.
    for (int p = 0; p < pp; ++p) {
      for (int d = 0; d < dp && tp > 1; ++d) tp_groups_[{p, d}] = MakeGroup(store_, tp, timeout, "tp");
      for (int t = 0; t < tp && dp > 1; ++t) dp_groups_[{p, t}] = MakeGroup(store_, dp, timeout, "dp");
    }
    for (int d = 0; d < dp && pp > 1; ++d) {
      for (int t = 0; t < tp; ++t) pp_groups_[{d, t}] = MakeGroup(store_, pp, timeout, "pp");
    }
  }

  int size() const { return pp_ * dp_ * tp_; }
  int Rank(int p, int d, int t) const { return (p * dp_ + d) * tp_ + t; }
  Communicator* Tp(int p, int d, int t) const { return Member(tp_groups_, {p, d}, t); }
  Communicator* Dp(int p, int d, int t) const { return Member(dp_groups_, {p, t}, d); }
  Communicator* Pp(int p, int d, int t) const { return Member(pp_groups_, {d, t}, p); }

  // body(p, d, t) on one thread per rank; returns when all have.
  void RunRanks(const std::function<void(int, int, int)>& body) const {
    std::vector<std::thread> threads;
    for (int p = 0; p < pp_; ++p) {
      for (int d = 0; d < dp_; ++d) {
        for (int t = 0; t < tp_; ++t) threads.emplace_back([&body, p, d, t] { body(p, d, t); });
      }
    }
    for (std::thread& th : threads) th.join();
  }

 private:
  using Groups = std::map<std::pair<int, int>, std::vector<std::unique_ptr<Communicator>>>;
  static Communicator* Member(const Groups& groups, std::pair<int, int> key, int index) {
    auto it = groups.find(key);
    return it == groups.end() ? nullptr : it->second[static_cast<size_t>(index)].get();
  }

  const int pp_, dp_, tp_;
  InProcessStore store_;  // outlives the groups (declared first)
  Groups tp_groups_, dp_groups_, pp_groups_;
};

}  // namespace loom::comm::testing
