// The upper bounds of a job spec: each size above its bound is refused with
// the field named, before any cross-field rule multiplies unbounded values.
#include <string>

#include "common/spec/job_spec_limits.h"
#include "common/spec/job_spec_rules.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::spec {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;

JobSpec Valid() {
  JobSpec s;
  s.name = "bounded";
  s.model.num_kv_heads = 4;  // the parser resolves 0; a struct built here must set it
  s.data.train_path = "corpus.txt";
  s.data.val_path = "val.txt";
  s.parallelism.dp = 1;
  return s;
}

std::string Errors(const JobSpec& spec) {
  absl::Status status = ValidateJobSpec(spec);
  return status.ok() ? "" : std::string(status.message());
}

TEST(JobSpecLimits, TheDefaultsAcceptAnOrdinarySpec) {
  EXPECT_THAT(CheckJobSpecLimits(Valid()), IsEmpty());
  EXPECT_EQ(Errors(Valid()), "");
}

TEST(JobSpecLimits, EachBoundNamesItsField) {
  struct Case {
    void (*mutate)(JobSpec&);
    const char* message;
  };
  const Case cases[] = {
      {[](JobSpec& s) { s.model.num_layers = 1'000'000'000; },
       "model.num_layers=1000000000 must be at most 4096"},
      {[](JobSpec& s) { s.model.num_layers = 6'000'000; }, "model.num_layers=6000000"},
      {[](JobSpec& s) { s.model.vocab_size = int64_t{1} << 40; }, "model.vocab_size="},
      {[](JobSpec& s) { s.model.hidden_size = int64_t{1} << 40; }, "model.hidden_size="},
      {[](JobSpec& s) { s.model.num_heads = 1 << 20; }, "model.num_heads="},
      {[](JobSpec& s) { s.model.ffn_hidden_size = int64_t{1} << 40; }, "model.ffn_hidden_size="},
      {[](JobSpec& s) { s.model.max_seq_len = int64_t{1} << 40; }, "model.max_seq_len="},
      {[](JobSpec& s) { s.train.steps = int64_t{1} << 50; }, "train.steps="},
      {[](JobSpec& s) { s.train.global_batch_size = int64_t{1} << 50; },
       "train.global_batch_size="},
      {[](JobSpec& s) { s.resources.ranks = 1'000'000'000; },
       "resources.ranks=1000000000 must be at most 1048576"},
      {[](JobSpec& s) { s.parallelism.dp = int64_t{1} << 60; }, "parallelism.dp="},
      {[](JobSpec& s) { s.parallelism.pp = int64_t{1} << 60; }, "parallelism.pp="},
      {[](JobSpec& s) { s.parallelism.virtual_stages = 1 << 20; }, "parallelism.virtual_stages="},
      {[](JobSpec& s) {
         s.resources.device = DeviceKind::kGpu;
         s.resources.gpu = "h100-sxm";
         s.resources.gpus_per_node = 1 << 20;
       },
       "resources.gpus_per_node="},
      {[](JobSpec& s) {
         s.resources.device = DeviceKind::kGpu;
         s.resources.gpu = "h100-sxm";
         s.resources.nodes = 1 << 20;
         s.resources.gpus_per_node = 8;
       },
       "resources.nodes x resources.gpus_per_node=8388608"},
      {[](JobSpec& s) { s.data.train_path = std::string(5000, 'a'); },
       "data.train_path is 5000 bytes long"},
      {[](JobSpec& s) { s.checkpoint.keep = 1 << 30; }, "checkpoint.keep="},
      {[](JobSpec& s) { s.fault_tolerance.max_restarts = 1 << 30; },
       "fault_tolerance.max_restarts="},
      {[](JobSpec& s) { s.fault_tolerance.hang_timeout_s = 1e300; },
       "fault_tolerance.hang_timeout_s="},
      {[](JobSpec& s) { s.scheduling.priority = -2'000'000; },
       "scheduling.priority=-2000000 must be between -1000000 and 1000000"},
      {[](JobSpec& s) { s.scheduling.priority = int64_t{1} << 62; }, "scheduling.priority="},
      {[](JobSpec& s) { s.scheduling.max_runtime_s = 1e300; }, "scheduling.max_runtime_s="},
  };
  for (const Case& c : cases) {
    JobSpec s = Valid();
    c.mutate(s);
    EXPECT_THAT(Errors(s), HasSubstr(c.message));
  }
}

TEST(JobSpecLimits, HugeAxesAreRefusedWithoutOverflowingTheProductRule) {
  JobSpec s = Valid();
  s.parallelism.dp = int64_t{1} << 40;
  s.parallelism.tp = int64_t{1} << 40;
  s.parallelism.pp = int64_t{1} << 40;
  const std::string errors = Errors(s);
  EXPECT_THAT(errors, HasSubstr("parallelism.dp="));
  EXPECT_THAT(errors, HasSubstr("parallelism.tp="));
  EXPECT_THAT(errors, HasSubstr("parallelism.pp="));
  EXPECT_THAT(errors, ::testing::Not(HasSubstr("dp*tp*pp")));
}

TEST(JobSpecLimits, TighterLimitsApplyWhenGiven) {
  JobSpecLimits limits;
  limits.max_num_layers = 2;
  JobSpec s = Valid();
  s.model.num_layers = 4;
  EXPECT_THAT(CheckJobSpecLimits(s, limits),
              ::testing::ElementsAre("model.num_layers=4 must be at most 2"));
}

}  // namespace
}  // namespace loom::spec
