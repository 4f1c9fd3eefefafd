// The simulator against hand-worked timelines: deadlock detection under
// rendezvous sends, buffered sends, costs, and malformed lists.
#include "common/topology/simulator.h"

#include "gtest/gtest.h"

namespace loom::topology {
namespace {

std::vector<Instruction> L(const char* text) {
  absl::StatusOr<std::vector<Instruction>> parsed = ParseInstructions(text);
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  return *parsed;
}

SimOptions Mode(SendMode mode) {
  SimOptions o;
  o.send_mode = mode;
  return o;
}

// Sends right after each compute and receives right before: the classic
// order that only works when sends are buffered.
const char* kNaiveStage0 = "F0 sA0@1 F1 sA1@1 rG0@1 B0 rG1@1 B1";
const char* kNaiveStage1 = "rA0@0 F0 B0 sG0@0 rA1@0 F1 B1 sG1@0";

TEST(SimulatorTest, NaiveOrderDeadlocksUnderRendezvous) {
  absl::StatusOr<SimReport> r =
      SimulateStages({L(kNaiveStage0), L(kNaiveStage1)}, 1, 2, Mode(SendMode::kRendezvous));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->deadlocked);
  EXPECT_EQ(r->deadlock, "stage 0 blocked at #3 sA1@1; stage 1 blocked at #3 sG0@0");
}

TEST(SimulatorTest, NaiveOrderCompletesWithBufferedSends) {
  absl::StatusOr<SimReport> r =
      SimulateStages({L(kNaiveStage0), L(kNaiveStage1)}, 1, 2, Mode(SendMode::kBuffered));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_FALSE(r->deadlocked) << r->deadlock;
  // S0: F0 [0,1] F1 [1,2] B0 [4,6] B1 [7,9]; S1: F0 [1,2] B0 [2,4] F1 [4,5] B1 [5,7].
  EXPECT_DOUBLE_EQ(r->makespan, 9);
  EXPECT_DOUBLE_EQ(r->stages[1].finish, 7);
  EXPECT_DOUBLE_EQ(r->bubble_fraction, 0.5);
  EXPECT_EQ(r->stages[0].peak_activations, 2);
  EXPECT_EQ(r->stages[1].peak_activations, 1);
}

TEST(SimulatorTest, TransferAndComputeCosts) {
  SimOptions o;
  o.costs = {.forward = 1, .backward = 2, .transfer = 1};
  // S0 F0 [0,1] -> [1,2] -> S1 F0 [2,3] B0 [3,5] -> [5,6] -> S0 B0 [6,8].
  absl::StatusOr<SimReport> r =
      SimulateStages({L("F0 sA0@1 rG0@1 B0"), L("rA0@0 F0 B0 sG0@0")}, 1, 1, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->makespan, 8);
  EXPECT_DOUBLE_EQ(r->bubble_fraction, 5.0 / 3.0);
  o.costs = {.forward = 2, .backward = 3, .reduce_gradients = 1, .optimizer_step = 4};
  r = SimulateStages({L("F0 B0 RG OPT")}, 1, 1, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->makespan, 10);
  EXPECT_DOUBLE_EQ(r->bubble_fraction, 0);
}

TEST(SimulatorTest, ChunksOnOneStageNeedNoTransfers) {
  absl::StatusOr<SimReport> r = SimulateStages({L("F0 F0.1 B0.1 B0 RG OPT")}, 2, 1);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->deadlocked);
  EXPECT_DOUBLE_EQ(r->makespan, 6);
  EXPECT_FALSE(SimulateStages({L("F0.1 F0 B0.1 B0")}, 2, 1).ok());
}

TEST(SimulatorTest, WrapAroundChunkLabels) {
  // pp=2, v=2: stage 1 chunk 0 feeds stage 0 chunk 1 and gets its gradient back.
  absl::StatusOr<SimReport> r = SimulateStages(
      {L("F0 sA0@1 rA0.1@1 F0.1 sA0.1@1 rG0.1@1 B0.1 sG0.1@1 rG0@1 B0"),
       L("rA0@0 F0 sA0@0 rA0.1@0 F0.1 B0.1 sG0.1@0 rG0@0 B0 sG0@0")},
      2, 1);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->deadlocked) << r->deadlock;
  EXPECT_DOUBLE_EQ(r->makespan, 12);
}

void ExpectInvalid(const std::vector<std::vector<Instruction>>& lists, int64_t v, int64_t m,
                   const std::string& needle, SendMode mode = SendMode::kRendezvous) {
  absl::StatusOr<SimReport> r = SimulateStages(lists, v, m, Mode(mode));
  ASSERT_FALSE(r.ok()) << "expected an error containing: " << needle;
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status();
}

TEST(SimulatorTest, MalformedListsAreErrors) {
  ExpectInvalid({L("F0 sA0@1 F1 sA1@1 rG0@1 B0 rG1@1 B1"),
                 L("rA1@0 F0 B0 sG0@0 rA0@0 F1 B1 sG1@0")},
                1, 2, "must match");
  ExpectInvalid({L("F0 sA0@1 F1 sA1@1 rG0@1 B0 rG1@1 B1"),
                 L("rA1@0 F0 B0 sG0@0 rA0@0 F1 B1 sG1@0")},
                1, 2, "must match", SendMode::kBuffered);
  ExpectInvalid({L("F0 sA0@1 rG0@1 B0"), L("F0 B0 sG0@0")}, 1, 1, "before its input arrived");
  ExpectInvalid({L("sA0@1 F0 rG0@1 B0"), L("rA0@0 F0 B0 sG0@0")}, 1, 1, "before its forward ran");
  ExpectInvalid({L("F0 sA0@0 B0")}, 1, 1, "peer must be another stage");
  ExpectInvalid({L("F0 sA0@1 rG0@1 B0"), L("rA0@0 F0 sA0@0 B0 sG0@0")}, 1, 1, "no next chunk");
  ExpectInvalid({L("F0")}, 1, 1, "needs one of each");
  ExpectInvalid({L("F0 F0 B0")}, 1, 1, "repeats a forward");
  ExpectInvalid({L("B0")}, 1, 1, "before its forward");
  ExpectInvalid({L("F0 RG B0")}, 1, 1, "before every backward");
  ExpectInvalid({L("F0 B0 OPT")}, 1, 1, "ReduceGradients first");
  ExpectInvalid({L("F1 B1")}, 1, 1, "micro-batch out of range");
  ExpectInvalid({L("F0.1 B0.1")}, 1, 1, "chunk out of range");
  // pp=3: stage 0's activation must go to stage 1, not 2.
  ExpectInvalid({L("F0 sA0@2"), L(""), L("")}, 1, 1, "lives on stage 1");
}

}  // namespace
}  // namespace loom::topology
