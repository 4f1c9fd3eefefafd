// loomctl's verb table (client/verb_table.h) and the "did you mean" of every
// program (common/cli/closest_name.h): help, argument and flag checks
// generated from a table of the test's own.
#include "client/verb_table.h"

#include "absl/flags/flag.h"
#include "common/cli/closest_name.h"
#include "gtest/gtest.h"

ABSL_FLAG(bool, test_follow, false, "logs: keep streaming");
ABSL_FLAG(int32_t, test_rank, 0, "logs: the rank");
ABSL_FLAG(std::string, coordinator, "127.0.0.1:7070", "address of loom-coordinator");

namespace loom::client {
namespace {

int Nothing(const std::vector<std::string>&) { return 0; }

std::vector<Verb> Table() {
  return {{"logs", "ID", "a rank's log lines", {"test_follow", "test_rank"}, "loomctl logs j-1", Nothing},
          {"list", "", "every job", {}, "loomctl list", Nothing},
          {"export", "CHECKPOINT_DIR OUT_DIR", "a checkpoint to HF", {}, "loomctl export a b", Nothing},
          {"plan", "JOB.yaml", "the plan", {}, "loomctl plan j.yaml", Nothing, 0, 1}};
}

TEST(ClosestNameTest, SuggestsOnlyWhatIsClose) {
  const std::vector<std::string> names = {"status", "submit", "logs", "list", "watch"};
  EXPECT_EQ(cli::ClosestName("stauts", names), "status");
  EXPECT_EQ(cli::ClosestName("lgos", names), "logs");
  EXPECT_EQ(cli::ClosestName("wat", names), "watch");  // a prefix
  EXPECT_EQ(cli::ClosestName("frobnicate", names), "");
  EXPECT_EQ(cli::ClosestName("", names), "");
  EXPECT_EQ(cli::DidYouMean("folow", {"follow"}, "--"), " (did you mean '--follow'?)");
  EXPECT_EQ(cli::DidYouMean("zzz", {"follow"}), "");
}

TEST(VerbTableTest, HelpListsEveryVerbAndAVerbsFlagsWithDefaults) {
  const std::vector<Verb> verbs = Table();
  const std::string help = RenderHelp(verbs);
  for (const Verb& verb : verbs) EXPECT_NE(help.find("  " + verb.name), std::string::npos) << help;
  EXPECT_NE(help.find("--coordinator=127.0.0.1:7070"), std::string::npos) << help;
  const std::string logs = RenderVerbHelp(verbs[0]);
  EXPECT_NE(logs.find("usage: loomctl logs ID [--test_follow] [--test_rank=...]"), std::string::npos)
      << logs;
  EXPECT_NE(logs.find("--test_rank=0"), std::string::npos) << logs;
  EXPECT_NE(logs.find("keep streaming (default: off)"), std::string::npos) << logs;
  EXPECT_NE(logs.find("example:\n  loomctl logs j-1"), std::string::npos) << logs;
}

TEST(VerbTableTest, ChecksArgumentsAndFlagsAndNamesTheClosestVerb) {
  const std::vector<Verb> verbs = Table();
  EXPECT_EQ(FindVerb(verbs, "nope"), nullptr);
  EXPECT_EQ(UnknownVerbMessage(verbs, "lgos"),
            "unknown verb 'lgos' (did you mean 'logs'?)");
  EXPECT_EQ(CheckArgumentCount(verbs[0], {"logs", "j-1"}), "");
  EXPECT_EQ(CheckArgumentCount(verbs[0], {"logs"}), "logs needs ID");
  EXPECT_EQ(CheckArgumentCount(verbs[1], {"list", "x"}), "list takes no arguments (got 'x')");
  EXPECT_EQ(CheckArgumentCount(verbs[2], {"export", "a"}), "export needs CHECKPOINT_DIR OUT_DIR");
  EXPECT_EQ(CheckArgumentCount(verbs[3], {"plan"}), "");  // min 0, max 1
  EXPECT_EQ(CheckFlags(verbs[0], {"test_follow", "coordinator"}), "");
  EXPECT_EQ(CheckFlags(verbs[1], {"test_follow"}),
            "--test_follow does not apply to list (it takes no flags of its own)");
}

}  // namespace
}  // namespace loom::client
