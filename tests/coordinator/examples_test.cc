// Every job spec shipped in examples/ parses, passes the spec's rules and is
// one the engine runs (what SubmitJob checks before storing a job), so the
// files users copy from stay valid as the rules move; and the composed layouts
// are admitted.
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "common/spec/job_spec_rules.h"
#include "common/spec/job_spec_yaml.h"
#include "coordinator/service/plan_service.h"

namespace loom::coordinator {
namespace {

TEST(ExamplesTest, EveryExampleSpecIsAcceptedAsSubmitted) {
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(LOOM_EXAMPLES_DIR)) {
    if (entry.path().extension() != ".yaml") continue;
    SCOPED_TRACE(entry.path().string());
    std::ifstream in(entry.path());
    std::stringstream text;
    text << in.rdbuf();
    absl::StatusOr<spec::JobSpec> parsed =
        spec::ParseJobSpecYaml(text.str(), entry.path().filename().string());
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_TRUE(spec::ValidateJobSpec(*parsed).ok()) << spec::ValidateJobSpec(*parsed);
    EXPECT_TRUE(CheckEngineSupports(*parsed).ok()) << CheckEngineSupports(*parsed);
    ++checked;
  }
  EXPECT_GE(checked, 3);
}

// The axes compose: ZeRO under TP and PP and tied embeddings under PP are
// admitted; what the engine cannot run (ZeRO-3 with PP, cp, ep) is refused
// with the field named.
TEST(ExamplesTest, ComposedLayoutsAreAdmitted) {
  spec::JobSpec job;
  job.train.global_batch_size = 16;
  job.train.micro_batch_size = 2;
  job.parallelism.dp = 2;
  job.parallelism.tp = 2;
  job.parallelism.pp = 2;
  job.model.tie_embeddings = true;
  for (int zero : {0, 1, 2}) {
    job.parallelism.zero_stage = zero;
    EXPECT_TRUE(CheckEngineSupports(job).ok()) << zero << ": " << CheckEngineSupports(job);
  }
  job.parallelism.pp = 1;
  job.parallelism.zero_stage = 3;
  EXPECT_TRUE(CheckEngineSupports(job).ok()) << CheckEngineSupports(job);
  job.parallelism.pp = 2;
  const absl::Status refused = CheckEngineSupports(job);
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("parallelism.zero_stage=3"), std::string::npos) << refused;
}

}  // namespace
}  // namespace loom::coordinator
