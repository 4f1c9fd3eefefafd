// The scheduling policy at scale (docs/scheduling.md): 256 nodes of 8 GPUs,
// 1,000 jobs of mixed sizes and priorities from 10 users, two of them under
// quotas, run to the end by a discrete-event simulation. Every decision must
// follow the rules: no start ahead of a reservation (priority and submission
// order), never more devices than free, quotas never exceeded, every job
// ends (none starves), and backfill actually fills gaps.
#include <cstdio>
#include <map>

#include "gtest/gtest.h"
#include "tests/coordinator/scheduling_simulation.h"

namespace loom::coordinator::sched::testing {
namespace {

SimConfig Config() {
  SimConfig config;
  config.user_quota = {{"user-0", 512}, {"user-1", 256}};
  return config;
}

TEST(SchedulingAtScale, EveryDecisionFollowsTheRules) {
  const SimResult result = Simulate(Config());
  for (const std::string& v : result.violations) ADD_FAILURE() << v;
  int backfilled = 0;
  for (const SimJob& j : result.jobs) {
    EXPECT_TRUE(j.done) << j.spec.id << " never ran";
    backfilled += j.how == Action::kBackfill ? 1 : 0;
  }
  EXPECT_GT(backfilled, 0) << "backfill never filled a gap";
  std::printf("decide calls %lld, decisions %lld, backfilled %d, max wait %.0f s, all done at %.0f s\n",
              static_cast<long long>(result.decide_calls),
              static_cast<long long>(result.decisions), backfilled, result.max_wait_s,
              result.end_s);
}

TEST(SchedulingAtScale, HigherPriorityWaitsLessOnAverage) {
  const SimResult result = Simulate(Config());
  std::map<int64_t, std::pair<double, int>> waits;  // priority -> (sum, count)
  for (const SimJob& j : result.jobs) {
    waits[j.spec.priority].first += j.start_s - j.submit_s;
    waits[j.spec.priority].second += 1;
  }
  ASSERT_EQ(waits.size(), 3u);
  const double low = waits[0].first / waits[0].second;
  const double high = waits[5].first / waits[5].second;
  EXPECT_LT(high, low);
}

TEST(SchedulingAtScale, StrictOrderWithoutBackfillNeverBackfills) {
  SimConfig config = Config();
  config.policy.backfill = false;
  config.jobs = 300;
  const SimResult result = Simulate(config);
  for (const std::string& v : result.violations) ADD_FAILURE() << v;
  for (const SimJob& j : result.jobs) {
    EXPECT_TRUE(j.done);
    EXPECT_NE(j.how, Action::kBackfill);
  }
}

}  // namespace
}  // namespace loom::coordinator::sched::testing
