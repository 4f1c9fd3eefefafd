// Compact text form of pipeline instructions.
#include "common/topology/instruction.h"

#include "gtest/gtest.h"

namespace loom::topology {
namespace {

TEST(InstructionTest, FormatsEachKind) {
  EXPECT_EQ(FormatInstruction(Instruction::Forward(3, 0)), "F3");
  EXPECT_EQ(FormatInstruction(Instruction::Forward(3, 1)), "F3.1");
  EXPECT_EQ(FormatInstruction(Instruction::Backward(0, 2)), "B0.2");
  EXPECT_EQ(FormatInstruction(Instruction::RecvActivation(0, 3, 1)), "rA3.1@0");
  EXPECT_EQ(FormatInstruction(Instruction::SendActivation(2, 3, 0)), "sA3@2");
  EXPECT_EQ(FormatInstruction(Instruction::RecvGradient(2, 3, 0)), "rG3@2");
  EXPECT_EQ(FormatInstruction(Instruction::SendGradient(0, 11, 0)), "sG11@0");
  EXPECT_EQ(FormatInstructions({Instruction::ReduceGradients(), Instruction::OptimizerStep()}),
            "RG OPT");
}

TEST(InstructionTest, ParseInvertsFormat) {
  const std::vector<Instruction> list = {
      Instruction::RecvActivation(1, 0, 1), Instruction::Forward(0, 1),
      Instruction::SendActivation(3, 0, 1), Instruction::RecvGradient(3, 12, 1),
      Instruction::Backward(12, 1),         Instruction::SendGradient(1, 12, 1),
      Instruction::ReduceGradients(),       Instruction::OptimizerStep()};
  const std::string text = FormatInstructions(list);
  EXPECT_EQ(text, "rA0.1@1 F0.1 sA0.1@3 rG12.1@3 B12.1 sG12.1@1 RG OPT");
  absl::StatusOr<std::vector<Instruction>> parsed = ParseInstructions(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, list);
  EXPECT_TRUE(ParseInstructions("")->empty());
}

TEST(InstructionTest, ParseRejectsBadTokens) {
  for (const char* bad : {"X1", "rA3", "F", "Fx", "B1.", "sA1@", "F-1", "rG1@x", "F1.2.3"}) {
    absl::StatusOr<std::vector<Instruction>> parsed = ParseInstructions(std::string("F0 ") + bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_NE(parsed.status().message().find(bad), std::string::npos) << parsed.status();
  }
}

}  // namespace
}  // namespace loom::topology
