// The watch hub (coordinator/jobs/watch_hub.h): a watcher's snapshot carries
// the steps so far, updates reach every watcher until the last, watchers are
// bounded, and the step series is bounded and handed to the store in chunks
// that go on numbering where the stored ones left off.
#include "coordinator/jobs/watch_hub.h"

#include <memory>
#include <vector>

#include "gtest/gtest.h"

namespace loom::coordinator {
namespace {

class RecordingSink final : public WatchSink {
 public:
  void Push(const loom::v1::WatchJobResponse& update, bool last) override {
    updates.push_back(update);
    lasts.push_back(last);
  }
  std::vector<loom::v1::WatchJobResponse> updates;
  std::vector<bool> lasts;
};

loom::v1::JobProgress Step(int64_t step) {
  loom::v1::JobProgress p;
  p.set_step(step);
  p.set_loss(1.0 / static_cast<double>(step));
  return p;
}

loom::v1::WatchJobResponse Snapshot() {
  loom::v1::WatchJobResponse snapshot;
  snapshot.mutable_job()->set_id("job-1");
  return snapshot;
}

TEST(WatchHub, ASnapshotCarriesTheStepsAndUpdatesFollowUntilTheLast) {
  WatchHub hub(/*max_watchers_per_job=*/2);
  for (int s = 1; s <= 3; ++s) hub.AddStep("job-1", Step(s));
  auto sink = std::make_shared<RecordingSink>();
  auto handle = hub.Subscribe("job-1", Snapshot(), /*ended=*/false, sink);
  ASSERT_TRUE(handle.ok());
  EXPECT_GT(*handle, 0);
  ASSERT_EQ(sink->updates.size(), 1u);
  EXPECT_EQ(sink->updates[0].backlog_size(), 3);
  EXPECT_EQ(sink->updates[0].backlog(2).step(), 3);
  EXPECT_FALSE(sink->lasts[0]);

  auto second = std::make_shared<RecordingSink>();
  ASSERT_TRUE(hub.Subscribe("job-1", Snapshot(), false, second).ok());
  auto third = hub.Subscribe("job-1", Snapshot(), false, std::make_shared<RecordingSink>());
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);

  loom::v1::WatchJobResponse update;
  *update.mutable_progress() = Step(4);
  hub.Push("job-1", update, false);
  hub.Push("job-1", update, /*last=*/true);
  EXPECT_EQ(sink->updates.size(), 3u);
  EXPECT_TRUE(sink->lasts.back());
  EXPECT_EQ(second->updates.size(), 3u);
  EXPECT_EQ(hub.Watchers("job-1"), 0u);  // let go after the last
  hub.Push("job-1", update, false);
  EXPECT_EQ(sink->updates.size(), 3u);
}

TEST(WatchHub, AnEndedJobsWatcherGetsItsSnapshotAsTheLastUpdate) {
  WatchHub hub;
  hub.AddStep("job-1", Step(1));
  auto sink = std::make_shared<RecordingSink>();
  auto handle = hub.Subscribe("job-1", Snapshot(), /*ended=*/true, sink);
  ASSERT_TRUE(handle.ok());
  EXPECT_EQ(*handle, 0);
  ASSERT_EQ(sink->updates.size(), 1u);
  EXPECT_TRUE(sink->lasts[0]);
  EXPECT_EQ(sink->updates[0].backlog_size(), 1);
  EXPECT_EQ(hub.Watchers("job-1"), 0u);
}

TEST(WatchHub, StepsAreBoundedAndStoredInChunksThatGoOnNumbering) {
  WatchHub hub(64, /*backlog_steps=*/600);
  for (int s = 1; s <= 300; ++s) hub.AddStep("job-1", Step(s));
  UnstoredSteps unstored = hub.Unstored("job-1");
  EXPECT_EQ(unstored.through, 300);
  EXPECT_EQ(unstored.keep_chunks_from, 0);
  ASSERT_EQ(unstored.chunks.size(), 2u);  // 256 + 44
  EXPECT_EQ(unstored.chunks[0].index, 0);
  EXPECT_EQ(unstored.chunks[0].steps.steps_size(), kStepsPerChunk);
  EXPECT_EQ(unstored.chunks[1].steps.steps(0).step(), 257);
  hub.StepsStored("job-1", unstored.through);
  EXPECT_TRUE(hub.Unstored("job-1").chunks.empty());

  // Only the chunk that gained steps is written again, whole.
  hub.AddStep("job-1", Step(301));
  unstored = hub.Unstored("job-1");
  ASSERT_EQ(unstored.chunks.size(), 1u);
  EXPECT_EQ(unstored.chunks[0].index, 1);
  EXPECT_EQ(unstored.chunks[0].steps.steps_size(), 45);

  // Past the bound the oldest steps go, and so do their chunks in the store.
  for (int s = 302; s <= 900; ++s) hub.AddStep("job-1", Step(s));
  EXPECT_EQ(hub.Steps("job-1")->size(), 600u);
  EXPECT_EQ(hub.Steps("job-1")->front().step(), 301);
  unstored = hub.Unstored("job-1");
  EXPECT_EQ(unstored.keep_chunks_from, 300 / kStepsPerChunk);
  EXPECT_EQ(unstored.through, 900);

  // After a restart the stored steps come back and new ones land after them.
  StoredSteps stored;
  stored.first = 256;
  for (int s = 257; s <= 900; ++s) stored.steps.push_back(Step(s));
  WatchHub restarted(64, 600);
  restarted.Restore("job-1", stored);
  EXPECT_EQ(restarted.Steps("job-1")->size(), 600u);
  EXPECT_EQ(restarted.Steps("job-1")->front().step(), 301);
  EXPECT_TRUE(restarted.Unstored("job-1").chunks.empty());
  restarted.AddStep("job-1", Step(901));
  unstored = restarted.Unstored("job-1");
  ASSERT_EQ(unstored.chunks.size(), 1u);
  EXPECT_EQ(unstored.chunks[0].index, 900 / kStepsPerChunk);
  EXPECT_EQ(unstored.chunks[0].steps.steps(unstored.chunks[0].steps.steps_size() - 1).step(), 901);
  EXPECT_EQ(unstored.through, 901);
}

TEST(WatchHub, WatchViewLeavesOutWhatGrowsOrIsSecret) {
  loom::v1::Job job;
  job.set_id("job-1");
  job.set_spec_yaml("name: x");
  job.set_resolved_spec_yaml("name: x");
  job.set_store_namespace("job-1/attempt-1-secret");
  job.add_placement()->set_rank(0);
  job.set_state(loom::v1::RUNNING);
  const loom::v1::Job view = WatchHub::WatchView(job);
  EXPECT_TRUE(view.spec_yaml().empty());
  EXPECT_TRUE(view.resolved_spec_yaml().empty());
  EXPECT_TRUE(view.store_namespace().empty());
  EXPECT_EQ(view.placement_size(), 0);
  EXPECT_EQ(view.state(), loom::v1::RUNNING);
}

}  // namespace
}  // namespace loom::coordinator
