// The straggler detector on synthetic compute times: identical ranks with
// noise flag no one; a rank slowed on some steps (as a process stopped for a
// part of every half second is) is named within a few windows, its peers are
// not; it is cleared once it recovers; stages are compared only within
// themselves; a stage of two ranks is judged by each rank's own history.
#include "coordinator/health/straggler_detector.h"

#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace loom::coordinator {
namespace {

// Compute times around `base` with +-`spread` relative uniform noise.
class Noise {
 public:
  explicit Noise(uint32_t seed) : gen_(seed) {}
  double Around(double base, double spread) {
    return base * (1 + std::uniform_real_distribution<double>(-spread, spread)(gen_));
  }

 private:
  std::mt19937 gen_;
};

// Feeds `steps` steps from `first` for every rank; compute(rank, step).
template <typename Fn>
void Feed(StragglerDetector& d, int ranks, int64_t first, int64_t steps, Fn compute) {
  for (int64_t step = first; step < first + steps; ++step) {
    for (int r = 0; r < ranks; ++r) d.Observe(r, step, compute(r, step), 0.2);
  }
}

TEST(StragglerDetectorTest, IdenticalNoisyRanksFlagNoOneOverLongRuns) {
  StragglerDetector d(StragglerPolicy{}, {0, 0, 0, 0});
  Noise noise(7);
  for (int64_t step = 1; step <= 400; ++step) {
    for (int r = 0; r < 4; ++r) d.Observe(r, step, noise.Around(0.1, 0.15), 0.2);
    ASSERT_TRUE(d.Stragglers().empty()) << "step " << step << " rank score "
                                        << d.Scores()[0].score;
  }
}

TEST(StragglerDetectorTest, PeriodicallyStoppedRankIsNamedWithinTwentyStepsAndPeersScoreNormal) {
  StragglerDetector d(StragglerPolicy{}, {0, 0, 0, 0});
  Noise noise(11);
  // Rank 2 loses 150 ms on one step in every three or four (a process stopped
  // 150 ms of every 500 ms, with 100-150 ms steps).
  int64_t named_at = 0;
  for (int64_t step = 1; step <= 20 && named_at == 0; ++step) {
    for (int r = 0; r < 4; ++r) {
      double c = noise.Around(0.1, 0.1);
      if (r == 2 && step % 7 % 3 == 0) c += 0.15;
      d.Observe(r, step, c, 0.2);
    }
    if (!d.Stragglers().empty()) named_at = step;
  }
  ASSERT_GT(named_at, 0) << "not named within 20 steps; score " << d.Scores()[2].score;
  const std::vector<StragglerScore> flagged = d.Stragglers();
  ASSERT_EQ(flagged.size(), 1u);
  EXPECT_EQ(flagged[0].rank, 2);
  EXPECT_GT(flagged[0].peer_ratio, 1.15);
  EXPECT_GT(flagged[0].job_slowdown, 0.05);
  EXPECT_EQ(flagged[0].since_step, named_at);
  for (int r : {0, 1, 3}) {
    EXPECT_LT(d.Scores()[r].score, 2.0) << "rank " << r;
    EXPECT_FALSE(d.Scores()[r].straggler);
  }
}

TEST(StragglerDetectorTest, RecoveredRankIsClearedAndComparedWithItsOwnPast) {
  StragglerPolicy policy;
  StragglerDetector d(policy, {0, 0, 0, 0});
  Feed(d, 4, 1, 30, [](int, int64_t) { return 0.1; });
  EXPECT_NEAR(d.Scores()[1].self_ratio, 1.0, 1e-9);
  Feed(d, 4, 31, 20, [](int r, int64_t) { return r == 1 ? 0.15 : 0.1; });
  ASSERT_EQ(d.Stragglers().size(), 1u);
  EXPECT_NEAR(d.Stragglers()[0].self_ratio, 1.5, 1e-6);  // its earlier windows are the baseline
  EXPECT_NEAR(d.Stragglers()[0].peer_ratio, 1.5, 1e-6);
  Feed(d, 4, 51, policy.window + policy.judge, [](int, int64_t) { return 0.1; });
  EXPECT_TRUE(d.Stragglers().empty());
}

TEST(StragglerDetectorTest, StagesAreComparedOnlyWithinThemselves) {
  // Stage 1 does twice stage 0's work: not a straggler, its own peers agree.
  StragglerDetector d(StragglerPolicy{}, {0, 0, 0, 1, 1, 1});
  Feed(d, 6, 1, 50, [](int r, int64_t) { return r < 3 ? 0.1 : 0.2; });
  EXPECT_TRUE(d.Stragglers().empty());
  Feed(d, 6, 51, 20, [](int r, int64_t) { return r < 3 ? 0.1 : (r == 4 ? 0.3 : 0.2); });
  ASSERT_EQ(d.Stragglers().size(), 1u);
  EXPECT_EQ(d.Stragglers()[0].rank, 4);
}

TEST(StragglerDetectorTest, TwoRankStageIsJudgedByEachRanksOwnHistory) {
  StragglerDetector d(StragglerPolicy{}, {0, 0});
  // Different but steady: each is its own baseline, no one is flagged.
  Feed(d, 2, 1, 40, [](int r, int64_t) { return r == 0 ? 0.1 : 0.13; });
  EXPECT_TRUE(d.Stragglers().empty());
  // Rank 0 slows down against its own past.
  Feed(d, 2, 41, 20, [](int r, int64_t) { return r == 0 ? 0.16 : 0.13; });
  ASSERT_EQ(d.Stragglers().size(), 1u);
  EXPECT_EQ(d.Stragglers()[0].rank, 0);
}

TEST(StragglerDetectorTest, ASlowdownEveryRankSharesIsNoOnesAgainstTheirOwnPasts) {
  // A loaded machine: both ranks of a two-rank stage, and the ranks of a
  // pipeline's one-rank stages, slow down together. Each is slower than its
  // own past, none slower than the others: no one is named. (CI once named
  // both ranks of a dp2 job "1.00x its peers' median, 1.52x its own earlier".)
  for (const std::vector<int>& classes : {std::vector<int>{0, 0}, std::vector<int>{0, 1, 2}}) {
    StragglerDetector d(StragglerPolicy{}, classes);
    const int ranks = static_cast<int>(classes.size());
    Feed(d, ranks, 1, 40, [](int, int64_t) { return 0.1; });
    for (int64_t step = 41; step <= 80; ++step) {
      for (int r = 0; r < ranks; ++r) d.Observe(r, step, r == 0 ? 0.152 : 0.158, 0.2);
      ASSERT_TRUE(d.Stragglers().empty()) << ranks << " ranks, step " << step;
      // Each is slower than its past (until the new pace becomes that past).
      if (step == 48) EXPECT_GT(d.Scores()[0].self_ratio, 1.4) << ranks << " ranks";
    }
    // One of them slowing further, alone, is a straggler again.
    Feed(d, ranks, 81, 20, [](int r, int64_t) { return r == 1 ? 0.24 : 0.155; });
    ASSERT_EQ(d.Stragglers().size(), 1u) << ranks << " ranks";
    EXPECT_EQ(d.Stragglers()[0].rank, 1);
  }
}

TEST(StragglerDetectorTest, OneHiccupIsNotAStraggler) {
  // Rank 3 descheduled once, for 300 ms and then for 5 s: each scores high
  // while in the window, but without the window's largest step nothing is
  // left, so neither is ever over.
  StragglerDetector d(StragglerPolicy{}, {0, 0, 0, 0});
  for (int64_t step = 1; step <= 90; ++step) {
    for (int r = 0; r < 4; ++r) {
      double c = 0.1;
      if (r == 3 && step == 30) c = 0.4;
      if (r == 3 && step == 60) c = 5.0;
      d.Observe(r, step, c, 0.2);
    }
    ASSERT_TRUE(d.Stragglers().empty()) << "step " << step;
  }
}

TEST(StragglerDetectorTest, AHiccupInATwoRankStageIsNotAStraggler) {
  StragglerDetector d(StragglerPolicy{}, {0, 0});
  for (int64_t step = 1; step <= 80; ++step) {
    for (int r = 0; r < 2; ++r) d.Observe(r, step, r == 0 && step == 50 ? 0.6 : 0.1, 0.2);
    ASSERT_TRUE(d.Stragglers().empty()) << "step " << step;
  }
}

TEST(StragglerDetectorTest, AJobOfOneRankIsNeverNamed) {
  StragglerDetector d(StragglerPolicy{}, {0});
  Feed(d, 1, 1, 40, [](int, int64_t) { return 0.1; });
  Feed(d, 1, 41, 40, [](int, int64_t) { return 0.3; });  // slower than its past: no one waits
  EXPECT_TRUE(d.Stragglers().empty());
}

TEST(StragglerDetectorTest, HiccupsTwoWindowsApartAreNotAStraggler) {
  StragglerDetector d(StragglerPolicy{}, {0, 0, 0, 0});
  Noise noise(5);
  for (int64_t step = 1; step <= 200; ++step) {
    for (int r = 0; r < 4; ++r) {
      double c = noise.Around(0.1, 0.1);
      if (r == 1 && step % 16 == 0) c += 0.3;  // descheduled every 16 steps
      d.Observe(r, step, c, 0.2);
    }
    ASSERT_TRUE(d.Stragglers().empty()) << "step " << step;
  }
}

TEST(StragglerDetectorTest, ReportsInAnyOrderResentOrLateChangeNothing) {
  StragglerDetector d(StragglerPolicy{}, {0, 0, 0});
  // Ranks report steps out of order; a step is scored once all have it.
  EXPECT_FALSE(d.Observe(0, 2, 0.1, 0.2));
  EXPECT_FALSE(d.Observe(0, 1, 0.1, 0.2));
  EXPECT_FALSE(d.Observe(1, 1, 0.1, 0.2));
  EXPECT_TRUE(d.Observe(2, 1, 0.1, 0.2));
  EXPECT_FALSE(d.Observe(2, 1, 9.0, 0.2));   // resent after scoring: ignored
  EXPECT_FALSE(d.Observe(0, 2, 9.0, 0.2));   // a duplicate: the first stands
  EXPECT_FALSE(d.Observe(7, 2, 0.1, 0.2));   // no such rank
  EXPECT_FALSE(d.Observe(-1, 2, 0.1, 0.2));
  EXPECT_FALSE(d.Observe(1, 0, 0.1, 0.2));   // not a step
}

TEST(StragglerDetectorTest, ARankThatNeverReportsLeavesTheOthersUnscoredWithoutGrowing) {
  StragglerDetector d(StragglerPolicy{}, {0, 0, 0});
  for (int64_t step = 1; step <= 10000; ++step) {
    d.Observe(0, step, 0.1, 0.2);
    d.Observe(1, step, 0.5, 0.2);
  }
  EXPECT_TRUE(d.Stragglers().empty());
  EXPECT_EQ(d.Scores()[1].score, 0);
}

}  // namespace
}  // namespace loom::coordinator
