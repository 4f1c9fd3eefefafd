// The timed groups (worker/comm/timed_communicator.h) over real Gloo groups
// of ranks run as threads: the rank that arrives late at a collective is
// blocked least and its peers wait for it; asynchronous calls count their
// Wait; a step's summary has one entry per group and operation kind.
#include <chrono>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/comm/rank_harness.h"
#include "worker/comm/collective_clock.h"
#include "worker/comm/timed_communicator.h"

namespace loom::comm {
namespace {

using testing::MakeGroup;
using testing::RunRanks;

struct TimedGroup {
  std::vector<std::shared_ptr<CollectiveClock>> clocks;
  std::vector<std::unique_ptr<Communicator>> comms;
};

TimedGroup Timed(std::vector<std::unique_ptr<Communicator>> plain) {
  TimedGroup g;
  for (auto& c : plain) {
    g.clocks.push_back(std::make_shared<CollectiveClock>());
    g.comms.push_back(std::make_unique<TimedCommunicator>(std::move(c), g.clocks.back()));
  }
  return g;
}

const CollectiveSummary* Find(const StepCollectives& s, const std::string& op) {
  for (const CollectiveSummary& c : s.ops) {
    if (c.op == op) return &c;
  }
  return nullptr;
}

TEST(TimedCommunicatorTest, TheLateRankIsBlockedLeastAndArrivesLast) {
  InProcessStore store;
  TimedGroup g = Timed(MakeGroup(store, 3, absl::Seconds(20)));
  for (auto& clock : g.clocks) clock->BeginStep(absl::Now());
  RunRanks(g.comms, [&](int r, Communicator& comm) {
    // Rank 2 works 300 ms longer before the all-reduce.
    if (r == 2) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    std::vector<float> x(1000, 1.0f);
    ASSERT_TRUE(comm.AllReduce(x).ok());
    ASSERT_TRUE(comm.AllReduce(x).ok());
    ASSERT_TRUE(comm.Barrier().ok());
  });
  for (int r = 0; r < 3; ++r) {
    const StepCollectives s = g.clocks[r]->Summary();
    ASSERT_EQ(s.ops.size(), 2u) << "rank " << r;  // all_reduce and barrier
    const CollectiveSummary* ar = Find(s, "all_reduce");
    ASSERT_NE(ar, nullptr);
    EXPECT_EQ(ar->calls, 2);
    EXPECT_EQ(ar->group, g.comms[r]->name());
    EXPECT_LE(ar->first_arrival, ar->last_arrival);
    if (r == 2) {
      EXPECT_GE(ar->first_arrival, absl::Milliseconds(290));
      EXPECT_LT(s.blocked, absl::Milliseconds(250)) << "the late rank waits for no one";
    } else {
      EXPECT_LT(ar->first_arrival, absl::Milliseconds(250));
      EXPECT_GE(ar->blocked, absl::Milliseconds(200)) << "rank " << r << " waits for rank 2";
    }
  }
}

TEST(TimedCommunicatorTest, AnAsynchronousCallCountsItsWaitOnce) {
  InProcessStore store;
  TimedGroup g = Timed(MakeGroup(store, 2, absl::Seconds(20)));
  for (auto& clock : g.clocks) clock->BeginStep(absl::Now());
  RunRanks(g.comms, [&](int r, Communicator& comm) {
    std::vector<float> x(1000, 1.0f);
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    std::unique_ptr<Work> work = comm.AllReduceAsync(x, ReduceOp::kSum);
    ASSERT_TRUE(work->Wait().ok());
    ASSERT_TRUE(work->Wait().ok());
  });
  const CollectiveSummary* waited = Find(g.clocks[0]->Summary(), "all_reduce");
  ASSERT_NE(waited, nullptr);
  EXPECT_EQ(waited->calls, 1);
  EXPECT_GE(waited->blocked, absl::Milliseconds(150));
}

TEST(TimedCommunicatorTest, NothingCountsBeforeAStepAndEachStepStartsEmpty) {
  InProcessStore store;
  TimedGroup g = Timed(MakeGroup(store, 2, absl::Seconds(20)));
  auto reduce = [&] {
    RunRanks(g.comms, [&](int, Communicator& comm) {
      std::vector<float> x(10, 1.0f);
      ASSERT_TRUE(comm.AllReduce(x).ok());
    });
  };
  reduce();  // before the first step: the groups' setup, a restore
  EXPECT_TRUE(g.clocks[0]->Summary().ops.empty());
  g.clocks[0]->BeginStep(absl::Now());
  reduce();
  EXPECT_EQ(g.clocks[0]->Summary().ops.size(), 1u);
  g.clocks[0]->BeginStep(absl::Now());
  EXPECT_TRUE(g.clocks[0]->Summary().ops.empty());
  EXPECT_EQ(g.clocks[0]->Summary().blocked, absl::ZeroDuration());
  // The wrapped group is the group: same name, size, counters.
  EXPECT_EQ(g.comms[0]->size(), 2);
  EXPECT_EQ(g.comms[0]->Stats().at("all_reduce").calls, 2);
}

}  // namespace
}  // namespace loom::comm
