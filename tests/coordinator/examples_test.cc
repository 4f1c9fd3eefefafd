// Every job spec shipped in examples/ parses, passes the spec's rules and is
// one the engine runs (what SubmitJob checks before storing a job), so the
// files users copy from stay valid as the rules move.
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

}  // namespace
}  // namespace loom::coordinator
