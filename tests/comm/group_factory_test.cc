// Mesh groups built from member lists: every member derives the same names
// and keys, groups of one need no Gloo, and a group created twice works.
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "worker/comm/group_factory.h"
#include "worker/comm/in_process_store.h"

namespace loom::comm {
namespace {

TEST(GroupNamesTest, NamesAndKeysComeFromTheMembers) {
  EXPECT_EQ(GroupDisplayName("tp", {0, 1}), "tp[0,1]");
  std::vector<int> many;
  for (int i = 0; i < 64; ++i) many.push_back(8 * i);
  EXPECT_EQ(GroupDisplayName("dp", many), "dp[0,8,16,...,504]");
  EXPECT_EQ(GroupKeyPrefix("job7/attempt2", "tp", {4, 5}), "job7/attempt2/tp/4,5");
  EXPECT_EQ(GroupKeyPrefix("", "tp", {4, 5}), "tp/4,5");
  const std::string long_key = GroupKeyPrefix("j", "dp", many);
  EXPECT_EQ(long_key.rfind("j/dp/n64-0-", 0), 0u) << long_key;
  std::vector<int> other = many;
  std::swap(other[1], other[2]);
  EXPECT_NE(GroupKeyPrefix("j", "dp", other), long_key);
}

TEST(GroupFactoryTest, BuildsTpAndDpGroupsOfAFourRankMesh) {
  // dp=2 x tp=2, tp fastest: tp groups {0,1} {2,3}, dp groups {0,2} {1,3}.
  InProcessStore store;
  const std::vector<std::vector<int>> tp = {{0, 1}, {0, 1}, {2, 3}, {2, 3}};
  const std::vector<std::vector<int>> dp = {{0, 2}, {1, 3}, {0, 2}, {1, 3}};
  std::vector<std::thread> threads;
  for (int g = 0; g < 4; ++g) {
    threads.emplace_back([&, g] {
      auto tp_comm = CreateGroupCommunicator(store, "job/1", "tp", tp[g], g, absl::Seconds(20));
      ASSERT_TRUE(tp_comm.ok()) << tp_comm.status();
      auto dp_comm = CreateGroupCommunicator(store, "job/1", "dp", dp[g], g, absl::Seconds(20));
      ASSERT_TRUE(dp_comm.ok()) << dp_comm.status();
      // The same tp group once more: its own keys, its own connections.
      auto tp_again = CreateGroupCommunicator(store, "job/1", "tp", tp[g], g, absl::Seconds(20));
      ASSERT_TRUE(tp_again.ok()) << tp_again.status();
      auto pp_self = CreateGroupCommunicator(store, "job/1", "pp", {g}, g, absl::Seconds(20));
      ASSERT_TRUE(pp_self.ok()) << pp_self.status();

      EXPECT_EQ((*tp_comm)->name(), absl::StrCat("tp[", tp[g][0], ",", tp[g][1], "]"));
      EXPECT_EQ((*tp_comm)->rank(), g % 2);
      EXPECT_EQ((*dp_comm)->rank(), g / 2);
      EXPECT_EQ((*pp_self)->size(), 1);
      EXPECT_EQ((*pp_self)->name(), absl::StrCat("pp[", g, "]"));

      std::vector<float> x = {static_cast<float>(g)};
      ASSERT_TRUE((*tp_comm)->AllReduce(x).ok());
      EXPECT_EQ(x[0], tp[g][0] + tp[g][1]);
      std::vector<float> y = {static_cast<float>(g)};
      ASSERT_TRUE((*dp_comm)->AllReduce(y).ok());
      EXPECT_EQ(y[0], dp[g][0] + dp[g][1]);
      std::vector<float> z = {1.0f};
      ASSERT_TRUE((*tp_again)->AllReduce(z).ok());
      EXPECT_EQ(z[0], 2.0f);
      ASSERT_TRUE((*pp_self)->AllReduce(z).ok());
      EXPECT_EQ(z[0], 2.0f);
    });
  }
  for (auto& t : threads) t.join();
}

TEST(GroupFactoryTest, RejectsMemberListsThatCannotBeAGroup) {
  InProcessStore store;
  EXPECT_EQ(CreateGroupCommunicator(store, "j", "tp", {0, 1}, 5, absl::Seconds(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateGroupCommunicator(store, "j", "tp", {1, 1}, 1, absl::Seconds(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateGroupCommunicator(store, "j", "tp", {}, 0, absl::Seconds(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace loom::comm
