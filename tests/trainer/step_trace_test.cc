// `loomctl trace` on a rank (worker/trainer/step_trace.h): only the step
// asked for is recorded; phases become spans on the compute track, each
// ending where the next begins; collectives land on their group's track with
// bytes and time blocked; the caps drop and count what is beyond them; the
// control mailbox remembers which steps were asked for.
#include "worker/trainer/step_trace.h"

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/trainer/control_mailbox.h"

namespace loom::trainer {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1'700'000'000);

absl::Time At(int us) { return kStart + absl::Microseconds(us); }

TEST(StepTrace, OnlyTheStepAskedForIsRecorded) {
  StepTraceRecorder r;
  r.BeginStep(4, false, At(0));
  r.Phase("forward", 0, 0, At(10));
  r.Collective("tp[0,1]", "all_reduce", At(20), absl::Microseconds(5), 64, At(30));
  EXPECT_FALSE(r.Finish(4, At(100)).has_value());
  r.BeginStep(5, true, At(100));
  EXPECT_FALSE(r.Finish(6, At(200)).has_value());  // not the step begun
  EXPECT_FALSE(r.Finish(5, At(200)).has_value());  // recording stopped with that
}

TEST(StepTrace, PhasesAndCollectivesBecomeSpansOnTheirTracks) {
  StepTraceRecorder r;
  r.BeginStep(5, true, At(0));
  r.Phase("load_data", 0, 0, At(10));
  r.Phase("forward", 0, 1, At(20));
  r.Collective("tp[0,1]", "all_reduce", At(25), absl::Microseconds(4), 4096, At(35));
  r.Phase("backward", 0, 1, At(50));
  r.Collective("pp[0,2]", "send", At(60), absl::Microseconds(1), 128, At(61));
  r.Collective("tp[0,1]", "all_reduce", At(70), absl::Microseconds(2), 4096, At(72));
  std::optional<loom::v1::StepTrace> t = r.Finish(5, At(90));
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->step(), 5);
  EXPECT_EQ(t->start_unix_us(), absl::ToUnixMicros(kStart));
  EXPECT_EQ(t->end_us(), 90);
  ASSERT_EQ(t->tracks_size(), 3);
  EXPECT_EQ(t->tracks(0), kComputeTrack);
  EXPECT_EQ(t->tracks(1), "tp[0,1]");
  EXPECT_EQ(t->tracks(2), "pp[0,2]");
  ASSERT_EQ(t->events_size(), 6);
  // In the order they ended: load_data, the first all_reduce, forward, ...
  const loom::v1::TraceEvent& load = t->events(0);
  EXPECT_EQ(t->names(load.name()), "load_data");
  EXPECT_EQ(load.start_us(), 10);
  EXPECT_EQ(load.duration_us(), 10);
  EXPECT_EQ(load.micro_batch(), 0);
  const loom::v1::TraceEvent& reduce = t->events(1);
  EXPECT_EQ(t->tracks(reduce.track()), "tp[0,1]");
  EXPECT_EQ(t->names(reduce.name()), "all_reduce");
  EXPECT_EQ(reduce.start_us(), 25);
  EXPECT_EQ(reduce.duration_us(), 10);
  EXPECT_EQ(reduce.blocked_us(), 4);
  EXPECT_EQ(reduce.bytes(), 4096);
  const loom::v1::TraceEvent& forward = t->events(2);
  EXPECT_EQ(t->names(forward.name()), "forward");
  EXPECT_EQ(forward.duration_us(), 30);
  EXPECT_EQ(forward.chunk(), 1);
  const loom::v1::TraceEvent& backward = t->events(5);  // closed by Finish
  EXPECT_EQ(t->names(backward.name()), "backward");
  EXPECT_EQ(backward.start_us(), 50);
  EXPECT_EQ(backward.duration_us(), 40);
  EXPECT_EQ(t->dropped_events(), 0);
}

TEST(StepTrace, EventsBeyondTheCapAreDroppedAndCounted) {
  StepTraceRecorder r;
  r.BeginStep(1, true, At(0));
  const int calls = kMaxTraceEvents + 100;
  for (int i = 0; i < calls; ++i) {
    r.Collective("dp[0,1,2,3]", "all_reduce", At(i), absl::Microseconds(1), 4, At(i + 1));
  }
  std::optional<loom::v1::StepTrace> t = r.Finish(1, At(calls + 1));
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->events_size() + t->dropped_events(), calls);
  EXPECT_LE(t->events_size(), kMaxTraceEvents);
  EXPECT_GT(t->dropped_events(), 0);
  EXPECT_LE(static_cast<int64_t>(t->ByteSizeLong()), kMaxTraceBytes);
}

TEST(StepTrace, TracksAreCappedToo) {
  StepTraceRecorder r;
  r.BeginStep(1, true, At(0));
  for (int g = 0; g < kMaxTraceTracks + 3; ++g) {
    r.Collective(absl::StrCat("g", g), "send", At(g), absl::ZeroDuration(), 4, At(g + 1));
  }
  std::optional<loom::v1::StepTrace> t = r.Finish(1, At(100));
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->tracks_size(), kMaxTraceTracks);
  EXPECT_EQ(t->dropped_events(), 4);  // 16 tracks: compute and 15 groups
}

TEST(StepTrace, TheMailboxRemembersTheStepsAskedFor) {
  ControlMailbox mailbox;
  EXPECT_FALSE(mailbox.TraceWanted(12));
  loom::v1::RankControl m;
  m.mutable_trace()->set_job_id("job-1");
  m.mutable_trace()->set_step(12);
  mailbox.Post(m);
  EXPECT_TRUE(mailbox.TraceWanted(12));
  EXPECT_FALSE(mailbox.TraceWanted(13));
  EXPECT_FALSE(mailbox.AbortOf(0).has_value());  // a trace aborts nothing
}

}  // namespace
}  // namespace loom::trainer
