// The pieces in-place recovery adds to the communication layer: pair groups
// (a ring of buddies and a restore pair, created without deadlock in the one
// order every rank follows, each carrying transfers both ways) and the
// CommunicatorSet that aborts an attempt's groups together (a blocked
// collective returns ABORTED within a bound, and a group added after the
// abort is aborted at once). The bounds are loose: they tell "returned on the
// abort" from "returned at the 60 s timeout".
#include "worker/comm/pair_groups.h"

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/comm/rank_harness.h"
#include "worker/comm/communicator_set.h"
#include "worker/comm/in_process_store.h"
#include "worker/comm/prefix_store.h"

namespace loom::comm {
namespace {

using testing::MakeGroup;
using testing::UniquePrefix;

TEST(PairGroupsTest, ARingAndARestorePairMeetAndCarryTrafficBothWays) {
  // Four ranks on four nodes: buddy r+1, ward r-1; rank 2 was relaunched and
  // receives its copy from rank 3 (its old buddy), which is also its buddy.
  constexpr int kRanks = 4;
  InProcessStore store;
  const std::string ns = UniquePrefix("pairs");
  std::vector<std::map<int, std::unique_ptr<Communicator>>> pairs(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      PrefixStore view(store, ns);
      std::vector<int> peers = {(r + 1) % kRanks, (r + kRanks - 1) % kRanks, -1, r};
      if (r == 2) peers.push_back(3);
      PairGroupOptions options;
      options.timeout = absl::Seconds(30);
      auto made = CreatePairGroups(view, r, peers, options);
      ASSERT_TRUE(made.ok()) << made.status();
      pairs[static_cast<size_t>(r)] = std::move(*made);
    });
  }
  for (auto& t : threads) t.join();
  threads.clear();
  for (int r = 0; r < kRanks; ++r) {
    const auto& mine = pairs[static_cast<size_t>(r)];
    ASSERT_EQ(mine.size(), 2u) << "rank " << r;  // self and -1 skipped, duplicates merged
    for (const auto& [peer, group] : mine) {
      EXPECT_EQ(group->size(), 2);
      EXPECT_EQ(group->rank(), r < peer ? 0 : 1);
      EXPECT_EQ(group->name(),
                absl::StrCat("pair[", std::min(r, peer), ",", std::max(r, peer), "]"));
    }
  }
  // Every rank sends its number to its buddy while receiving its ward's.
  std::vector<float> got(kRanks, -1.0f);
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      Communicator& to_buddy = *pairs[static_cast<size_t>(r)].at((r + 1) % kRanks);
      Communicator& from_ward = *pairs[static_cast<size_t>(r)].at((r + kRanks - 1) % kRanks);
      std::vector<float> out = {static_cast<float>(r)}, in = {0.0f};
      auto recv = from_ward.RecvAsync(in, PairPeerOf(from_ward), 7);
      auto send = to_buddy.SendAsync(out, PairPeerOf(to_buddy), 7);
      ASSERT_TRUE(send->Wait().ok());
      ASSERT_TRUE(recv->Wait().ok());
      got[static_cast<size_t>(r)] = in[0];
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(got[static_cast<size_t>(r)], static_cast<float>((r + kRanks - 1) % kRanks));
  }
}

TEST(CommunicatorSetTest, AbortEndsABlockedCollectivePromptlyAndReachesLaterMembers) {
  InProcessStore store;
  auto comms = MakeGroup(store, 2, absl::Seconds(60), "dp");
  auto set = std::make_shared<CommunicatorSet>();
  Communicator* dp = set->Add(std::move(comms[0]));
  EXPECT_EQ(set->Add(nullptr), nullptr);
  EXPECT_EQ(set->members().size(), 1u);
  absl::Status result;
  double seconds = 0;
  std::thread blocked([&] {
    std::vector<float> x(1000);
    const auto start = std::chrono::steady_clock::now();
    result = dp->AllReduce(x);  // the peer never joins
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  });
  while (dp->Progress().current_op.empty())
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_FALSE(set->aborted());
  set->Abort("attempt 3 aborted by the coordinator: rank 2 exited");
  set->Abort("a second reason is not kept");
  blocked.join();
  EXPECT_TRUE(absl::IsAborted(result)) << result;
  EXPECT_NE(result.message().find("rank 2 exited"), std::string::npos) << result;
  EXPECT_LT(seconds, 30.0);  // far below the 60 s timeout
  EXPECT_TRUE(set->aborted());
  EXPECT_EQ(set->abort_reason(), "attempt 3 aborted by the coordinator: rank 2 exited");
  // A group built after the abort (the attempt was still rendezvousing) is
  // stopped as it joins the set.
  Communicator* late = set->Add(std::move(comms[1]));
  std::vector<float> y(4);
  absl::Status later = late->AllReduce(y);
  EXPECT_TRUE(absl::IsAborted(later)) << later;
  EXPECT_NE(later.message().find("rank 2 exited"), std::string::npos) << later;
}

}  // namespace
}  // namespace loom::comm
