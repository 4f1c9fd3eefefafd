// The scheduler (coordinator/jobs/job_scheduler.h) over the job table, the
// lifecycle, a persister on a store that fails on demand, and nodes that
// record what they are sent: the policy's order (priority, then submission), a
// job larger than the cluster skipped, the queue with its reasons, a restart placed only once its ranks are out and its
// backoff is over, and launches that leave only once their attempt is stored.
#include "coordinator/jobs/job_scheduler.h"

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "common/exit_codes.h"
#include "common/spec/job_spec_yaml.h"
#include "gtest/gtest.h"
#include "planner/job_planner.h"
#include "tests/coordinator/fake_job_store.h"
#include "tests/coordinator/job_manager_harness.h"

namespace loom::coordinator {
namespace {

using loom::v1::JobState;

class JobSchedulerTest : public ::testing::Test {
 protected:
  JobSchedulerTest()
      : persister_(&store_, {.first_retry = absl::Milliseconds(1),
                             .max_retry = absl::Milliseconds(5)}),
        table_({}, &persister_, &hub_),
        metrics_(nullptr),
        lifecycle_({}, &table_, &hub_, &metrics_, &nodes_, &kv_),
        scheduler_({.roots = {.data_roots = {"/data"}, .checkpoint_root = "/checkpoints"}},
                   &table_, &lifecycle_, &nodes_) {
    persister_.Start([this](std::vector<WriteResult> r) { table_.OnWritten(std::move(r)); },
                     [](const absl::Status&) {});
    scheduler_.Start();
  }
  ~JobSchedulerTest() override {
    scheduler_.Stop();
    persister_.Stop();
  }

  // A pending job of `ranks` CPU ranks (data-parallel), as admission stores it.
  std::string Pending(int ranks, int64_t priority = 0) {
    auto spec = spec::ParseJobSpecYaml(testing::kSmallDpSpec, "job.yaml");
    EXPECT_TRUE(spec.ok()) << spec.status();
    spec->resources.ranks = ranks;
    spec->parallelism.dp = ranks;
    spec->train.global_batch_size = 2 * ranks;
    spec->scheduling.priority = priority;
    EXPECT_TRUE(planner::ResolveLayout(*spec).ok());
    absl::MutexLock lock(&table_.mu());
    JobRecord record;
    record.spec = *spec;
    record.job.set_id(table_.NewIdLocked(&record.sequence));
    record.job.set_state(JobState::PENDING);
    record.job.set_resolved_spec_yaml(spec::ToYaml(*spec));
    // No planner's prediction: a job promises nothing unless a test says so
    // (predictions are scheduling_policy_test's).
    record.predicted_step_s = 0;
    return table_.InsertLocked(std::move(record)).job.id();
  }
  std::shared_ptr<testing::RecordingChannel> Node(const std::string& id, int devices) {
    auto channel = std::make_shared<testing::RecordingChannel>();
    loom::v1::RegisterNode r;
    r.set_node_id(id);
    loom::v1::Device* d = r.add_devices();
    d->set_kind("cpu");
    d->set_count(devices);
    nodes_.Register(r, channel, absl::Now());
    return channel;
  }
  void Settle() {
    for (int i = 0; i < 3; ++i) {
      scheduler_.WaitHandled();
      persister_.WaitIdle();
    }
    scheduler_.WaitHandled();
  }

  testing::FakeJobStore store_;
  WatchHub hub_;
  JobPersister persister_;
  JobTable table_;
  JobMetrics metrics_;
  NodeRegistry nodes_;
  KvStore kv_;
  JobLifecycle lifecycle_;
  JobScheduler scheduler_;
};

TEST_F(JobSchedulerTest, InOrderAJobLargerThanTheClusterDoesNotBlockAndTheQueueSaysWhy) {
  Node("node-a", 4);
  const std::string huge = Pending(8);
  const std::string first = Pending(2);
  const std::string second = Pending(4);
  const std::string third = Pending(1);
  absl::MutexLock lock(&table_.mu());
  const JobScheduler::Devices devices = {.capacity = {{"cpu", 4}},
                                         .nodes = {{"node-a", {"cpu", 4}}}};
  JobScheduler::Snapshot snapshot;
  ASSERT_TRUE(scheduler_.SnapshotNextLocked(devices, {}, snapshot));
  EXPECT_EQ(snapshot.job_id, first);  // huge could never fit: skipped
  table_.AtLocked(first).job.set_state(JobState::RUNNING);
  auto placement = std::make_shared<Placement>();
  for (int d = 0; d < 2; ++d) {
    loom::v1::RankPlacement* p = placement->Add();
    p->set_node_id("node-a");
    p->set_local_device(d);
  }
  table_.AtLocked(first).placement = placement;
  // second needs 4 with 2 free; third (1) stays behind it: without a promised
  // runtime it could delay second's start.
  JobScheduler::Snapshot none;
  EXPECT_FALSE(scheduler_.SnapshotNextLocked(devices, {}, none));
  const std::vector<QueueEntry> queue = scheduler_.Queue();
  ASSERT_EQ(queue.size(), 3u);
  EXPECT_EQ(queue[0].job_id, huge);
  EXPECT_EQ(queue[0].reason, "needs 8 cpu, the cluster has 4");
  EXPECT_EQ(queue[1].job_id, second);
  EXPECT_EQ(queue[1].reason, "needs 4 cpu, 2 free");
  EXPECT_EQ(queue[2].job_id, third);
  EXPECT_EQ(queue[2].reason, "behind " + second +
                                 " (priority 0, waiting for 4 cpu); no scheduling.max_runtime_s "
                                 "to backfill with");
  // Unless it promises to end first, in which case it backfills... but second
  // has no known start (first promised nothing): it still waits.
  table_.AtLocked(third).spec.scheduling.max_runtime_s = 60;
  EXPECT_FALSE(scheduler_.SnapshotNextLocked(devices, {}, none));
  // Once first promises to end, second's start is known and third fits before it.
  table_.AtLocked(first).spec.scheduling.max_runtime_s = 3600;
  ASSERT_TRUE(scheduler_.SnapshotNextLocked(devices, {}, none));
  EXPECT_EQ(none.job_id, third);
  EXPECT_EQ(none.taken.at("node-a"), (std::set<int32_t>{0, 1}));
}

TEST_F(JobSchedulerTest, HigherPriorityGoesFirstAndUnplaceableJobsWait) {
  Node("node-a", 4);
  const std::string early = Pending(4);
  const std::string urgent = Pending(4, 5);
  absl::MutexLock lock(&table_.mu());
  const JobScheduler::Devices devices = {.capacity = {{"cpu", 4}},
                                         .nodes = {{"node-a", {"cpu", 4}}}};
  JobScheduler::Snapshot snapshot;
  ASSERT_TRUE(scheduler_.SnapshotNextLocked(devices, {}, snapshot));
  EXPECT_EQ(snapshot.job_id, urgent);
  // The queue is what is left once urgent has taken the devices.
  ASSERT_EQ(scheduler_.Queue().size(), 1u);
  EXPECT_EQ(scheduler_.Queue()[0].reason, "needs 4 cpu, 0 free");
  // The pass found no nodes for urgent: it holds its place, nothing starts.
  EXPECT_FALSE(scheduler_.SnapshotNextLocked(devices, {urgent}, snapshot));
  ASSERT_EQ(scheduler_.Queue().size(), 2u);
  EXPECT_EQ(scheduler_.Queue()[0].reason, "needs 4 cpu on nodes that hold its layout, 4 free");
  EXPECT_EQ(scheduler_.Queue()[1].reason, "priority 0, behind " + urgent +
                                              " (priority 5); no scheduling.max_runtime_s to "
                                              "backfill with");
}

TEST_F(JobSchedulerTest, ARestartIsPlacedOnlyOnceItsRanksAreOutAndItsBackoffIsOver) {
  const std::string id = Pending(2);
  absl::MutexLock lock(&table_.mu());
  JobRecord& record = table_.AtLocked(id);
  record.job.set_state(JobState::RESTARTING);
  record.job.set_attempt(1);
  record.ranks.resize(2);
  record.ranks_exited = 1;
  record.ranks[0].exited = true;
  const JobScheduler::Devices devices = {.capacity = {{"cpu", 4}},
                                         .nodes = {{"node-a", {"cpu", 4}}}};
  JobScheduler::Snapshot snapshot;
  EXPECT_FALSE(scheduler_.SnapshotNextLocked(devices, {}, snapshot));  // a rank still runs
  record.ranks[1].exited = true;
  record.ranks_exited = 2;
  record.job.set_not_before_unix_ms(absl::ToUnixMillis(absl::Now() + absl::Hours(1)));
  EXPECT_FALSE(scheduler_.SnapshotNextLocked(devices, {}, snapshot));  // backing off
  record.job.set_not_before_unix_ms(0);
  ASSERT_TRUE(scheduler_.SnapshotNextLocked(devices, {}, snapshot));
  EXPECT_EQ(snapshot.attempt, 1);
}

TEST_F(JobSchedulerTest, AHigherPriorityJobStopsALowerOneGracefullyAndStartsOnItsDevices) {
  // A scheduler of its own with preemption on; no node is registered, so the
  // fixture's running scheduler places nothing meanwhile.
  JobScheduler preempting({.roots = {.data_roots = {"/data"}, .checkpoint_root = "/checkpoints"},
                           .policy = {.preemption = true}},
                          &table_, &lifecycle_, &nodes_);
  const std::string low = Pending(4);
  const std::string unsaved = Pending(2);
  const std::string urgent = Pending(4, 5);
  const JobScheduler::Devices devices = {.capacity = {{"cpu", 6}},
                                         .nodes = {{"node-a", {"cpu", 6}}}};
  {
    absl::MutexLock lock(&table_.mu());
    // low (4 ranks, checkpoints on) and unsaved (2 ranks, no checkpoint.dir)
    // run on node-a's six devices.
    int device = 0;
    for (const auto& [id, ranks, saves] :
         {std::tuple{low, 4, true}, std::tuple{unsaved, 2, false}}) {
      JobRecord& record = table_.AtLocked(id);
      record.job.set_state(JobState::RUNNING);
      record.job.set_attempt(1);
      if (saves) record.spec.checkpoint.dir = "ckpt";
      auto placement = std::make_shared<Placement>();
      for (int r = 0; r < ranks; ++r) {
        loom::v1::RankPlacement* p = placement->Add();
        p->set_rank(r);
        p->set_node_id("node-a");
        p->set_local_device(device++);
      }
      record.placement = placement;
      record.ranks.assign(static_cast<size_t>(ranks), RankState{});
    }
    JobScheduler::Snapshot snapshot;
    EXPECT_FALSE(preempting.SnapshotNextLocked(devices, {}, snapshot));
    ASSERT_TRUE(table_.AtLocked(low).job.has_stop());
    EXPECT_EQ(table_.AtLocked(low).job.stop().reason(),
              "preempted by " + urgent + " (priority 5)");
    EXPECT_FALSE(table_.AtLocked(unsaved).job.has_stop());  // it could not save its step
    ASSERT_EQ(preempting.Queue().size(), 1u);
    EXPECT_EQ(preempting.Queue()[0].reason, "preempts 1 job(s) of lower priority for 4 cpu");
    // The next pass stops no one else: it waits for low's devices.
    EXPECT_FALSE(preempting.SnapshotNextLocked(devices, {}, snapshot));
    EXPECT_EQ(preempting.Queue()[0].reason, "waits for 4 cpu of preempted jobs to come free");
  }
  for (int r = 0; r < 4; ++r) {
    loom::v1::RankExited exit;
    exit.set_job_id(low);
    exit.set_attempt(1);
    exit.set_rank(r);
    exit.set_exit_code(kExitStopped);
    lifecycle_.OnRankExited("node-a", exit);
  }
  absl::MutexLock lock(&table_.mu());
  EXPECT_EQ(table_.AtLocked(low).job.state(), JobState::PREEMPTED);
  JobScheduler::Snapshot snapshot;
  ASSERT_TRUE(preempting.SnapshotNextLocked(devices, {}, snapshot));
  EXPECT_EQ(snapshot.job_id, urgent);
  // low waits in line again, behind urgent's devices.
  ASSERT_EQ(preempting.Queue().size(), 1u);
  EXPECT_EQ(preempting.Queue()[0].job_id, low);
}

TEST_F(JobSchedulerTest, LaunchesLeaveOnlyOnceTheirAttemptIsStored) {
  auto node = Node("node-a", 2);
  store_.FailNext(1000000);  // the store is down
  const std::string id = Pending(2);
  scheduler_.Schedule();
  while (store_.writes() < 2) absl::SleepFor(absl::Milliseconds(1));  // placed, and retried
  scheduler_.WaitHandled();
  EXPECT_TRUE(node->messages().empty());
  EXPECT_EQ(table_.Get(id)->state(), JobState::PENDING);  // what is stored
  store_.FailNext(0);
  Settle();
  const auto sent = node->messages();
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[0].launch().assignment().attempt(), 1);
  EXPECT_EQ(store_.jobs().at(id).attempt(), 1);
  EXPECT_EQ(store_.jobs().at(id).state(), JobState::STARTING);
  EXPECT_EQ(table_.Get(id)->state(), JobState::STARTING);
}

}  // namespace
}  // namespace loom::coordinator
