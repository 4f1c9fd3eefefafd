// A rank's progress report bounded by its job (coordinator/jobs/report_bounds.h):
// each repeated field and string at its bound passes, one past it is refused
// naming the field, never quoting the value.
#include "coordinator/jobs/report_bounds.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::coordinator {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

spec::JobSpec MoeSpec(int64_t experts) {
  spec::JobSpec spec;
  spec.train.steps = 100;
  spec.train.global_batch_size = 16;
  spec.train.micro_batch_size = 2;
  spec.model.moe.num_experts = experts;
  return spec;
}

loom::v1::RankProgress Report() {
  loom::v1::RankProgress p;
  p.set_job_id("job-1");
  p.set_phase("step");
  p.set_step(100);
  p.set_micro_batch(8);
  return p;
}

std::string Refusal(const spec::JobSpec& spec, const loom::v1::RankProgress& p) {
  const absl::Status s = CheckReportBounds(spec, 4, p);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  return std::string(s.message());
}

TEST(ReportBounds, ExpertsAreBoundedByTheJobsModel) {
  loom::v1::RankProgress p = Report();
  for (int e = 0; e < 8; ++e) p.mutable_moe()->add_tokens_per_expert(1);
  EXPECT_TRUE(CheckReportBounds(MoeSpec(8), 4, p).ok());
  EXPECT_THAT(Refusal(MoeSpec(7), p), HasSubstr("moe.tokens_per_expert (entries) is 8"));
  // A dense job reports no expert at all.
  EXPECT_THAT(Refusal(MoeSpec(0), p), HasSubstr("model.moe.num_experts=0"));
  p.mutable_moe()->set_tokens_per_expert(3, -1);
  EXPECT_THAT(Refusal(MoeSpec(8), p), HasSubstr("finite and not negative"));
}

TEST(ReportBounds, StepsAndMicroBatchesAreBoundedByTheJobsTraining) {
  loom::v1::RankProgress p = Report();
  p.set_step(101);
  EXPECT_THAT(Refusal(MoeSpec(0), p), HasSubstr("step is 101"));
  p = Report();
  p.set_micro_batch(9);  // 16 / 2 = 8 micro-batches
  EXPECT_THAT(Refusal(MoeSpec(0), p), HasSubstr("micro_batch is 9"));
  p = Report();
  p.set_resumed_step(-5);
  EXPECT_THAT(Refusal(MoeSpec(0), p), HasSubstr("resumed_step"));
}

TEST(ReportBounds, GroupsStringsAndSnapshotsAreBounded) {
  loom::v1::RankProgress p = Report();
  for (int g = 0; g < kMaxReportGroups; ++g) p.add_groups()->set_group("dp[0,1]");
  EXPECT_TRUE(CheckReportBounds(MoeSpec(0), 4, p).ok());
  p.add_groups();
  EXPECT_THAT(Refusal(MoeSpec(0), p), HasSubstr("groups (entries) is 17"));

  p = Report();
  p.add_groups()->set_group(std::string(kMaxReportGroupNameBytes + 1, 'x'));
  const std::string why = Refusal(MoeSpec(0), p);
  EXPECT_THAT(why, HasSubstr("groups.group (bytes)"));
  EXPECT_THAT(why, Not(HasSubstr("xxxx")));  // the value is never quoted

  p = Report();
  p.set_phase("step\n[fake] log line");
  EXPECT_THAT(Refusal(MoeSpec(0), p), HasSubstr("phase must be printable ASCII"));

  p = Report();
  p.mutable_snapshots()->set_ward_rank(4);  // the job has ranks 0..3
  EXPECT_THAT(Refusal(MoeSpec(0), p), HasSubstr("snapshots.ward_rank is 4"));
  p.mutable_snapshots()->set_ward_rank(-1);
  for (int i = 0; i <= kMaxReportSnapshotSteps; ++i) p.mutable_snapshots()->add_own_steps(i);
  EXPECT_THAT(Refusal(MoeSpec(0), p), HasSubstr("snapshots.own_steps"));
}

loom::v1::RankProgress TracedReport() {
  loom::v1::RankProgress p = Report();
  loom::v1::StepTrace* t = p.mutable_trace();
  t->set_step(p.step());
  t->add_tracks("compute");
  t->add_names("forward");
  loom::v1::TraceEvent* e = t->add_events();
  e->set_track(0);
  e->set_name(0);
  e->set_duration_us(10);
  return p;
}

TEST(ReportBounds, ATraceIsBoundedAndItsIndicesPointIntoItsTables) {
  EXPECT_TRUE(CheckReportBounds(MoeSpec(0), 4, TracedReport()).ok());
  EXPECT_TRUE(CheckReportTrace(TracedReport()).ok());

  loom::v1::RankProgress p = TracedReport();
  p.mutable_trace()->set_step(99);
  EXPECT_THAT(Refusal(MoeSpec(0), p), HasSubstr("trace.step is 99"));

  p = TracedReport();
  p.mutable_trace()->mutable_events(0)->set_track(1);
  EXPECT_THAT(Refusal(MoeSpec(0), p), HasSubstr("trace.events.track is 1"));
  p = TracedReport();
  p.mutable_trace()->mutable_events(0)->set_name(-1);
  EXPECT_THAT(Refusal(MoeSpec(0), p), HasSubstr("trace.events.name is -1"));
  p = TracedReport();
  p.mutable_trace()->mutable_events(0)->set_duration_us(-5);
  EXPECT_THAT(Refusal(MoeSpec(0), p), HasSubstr("must not be negative"));

  p = TracedReport();
  for (int i = 1; i <= kMaxReportTraceTracks; ++i) p.mutable_trace()->add_tracks("t");
  EXPECT_THAT(Refusal(MoeSpec(0), p), HasSubstr("trace.tracks (entries)"));
  p = TracedReport();
  for (int i = 1; i <= kMaxReportTraceNames; ++i) p.mutable_trace()->add_names("n");
  EXPECT_THAT(Refusal(MoeSpec(0), p), HasSubstr("trace.names (entries)"));
  p = TracedReport();
  for (int i = 1; i <= kMaxReportTraceEvents; ++i) {
    *p.mutable_trace()->add_events() = p.trace().events(0);
  }
  EXPECT_THAT(Refusal(MoeSpec(0), p), HasSubstr("trace.events (entries)"));

  p = TracedReport();
  p.mutable_trace()->set_tracks(0, "tp[0,1]\n[fake]");
  EXPECT_THAT(Refusal(MoeSpec(0), p), HasSubstr("trace.tracks must be printable ASCII"));
  EXPECT_THAT(Refusal(MoeSpec(0), p), Not(HasSubstr("[fake]")));
}

TEST(ReportBounds, AReportIsBoundedInBytesBeforeAnythingIsWalked) {
  loom::v1::RankProgress p = Report();
  p.set_job_id(std::string(kMaxReportBytes, 'j'));
  EXPECT_THAT(Refusal(MoeSpec(0), p), HasSubstr("(encoded bytes)"));
}

}  // namespace
}  // namespace loom::coordinator
