// The scheduling policy (coordinator/jobs/scheduling_policy.h) and fair share
// (fair_share.h), over hand-made views of a cluster: order, reasons, quotas,
// EASY backfill, victims of preemption.
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "coordinator/jobs/fair_share.h"
#include "coordinator/jobs/scheduling_policy.h"
#include "gtest/gtest.h"

namespace loom::coordinator::sched {
namespace {

WaitingJob Waiting(std::string id, std::string user, int64_t devices, int64_t priority = 0,
                   int64_t order = 0, double runtime_s = 0) {
  return WaitingJob{.id = std::move(id),
                    .user = std::move(user),
                    .priority = priority,
                    .kind = "gpu",
                    .devices = devices,
                    .order = order,
                    .runtime_s = runtime_s};
}

RunningJob Running(std::string id, std::string user, int64_t devices, int64_t priority = 0,
                   double started_s = 0, double runtime_s = 0, int64_t work_lost = 0) {
  return RunningJob{.id = std::move(id),
                    .user = std::move(user),
                    .priority = priority,
                    .kind = "gpu",
                    .devices = devices,
                    .started_s = started_s,
                    .runtime_s = runtime_s,
                    .work_lost = work_lost};
}

ClusterView Cluster(int64_t capacity, int64_t free) {
  ClusterView view;
  view.now_s = 1000;
  view.capacity["gpu"] = capacity;
  view.free["gpu"] = free;
  return view;
}

std::map<std::string, Decision> ById(const std::vector<Decision>& decisions) {
  std::map<std::string, Decision> out;
  for (const Decision& d : decisions) out[d.job_id] = d;
  return out;
}

std::vector<std::string> Ids(const std::vector<Decision>& decisions) {
  std::vector<std::string> ids;
  for (const Decision& d : decisions) ids.push_back(d.job_id);
  return ids;
}

TEST(QueueOrder, PriorityThenFairShareThenSubmission) {
  ClusterView view = Cluster(8, 0);
  view.waiting = {Waiting("job-1", "alice", 1, 0, 1), Waiting("job-2", "bob", 1, 0, 2),
                  Waiting("job-3", "carol", 1, 5, 3), Waiting("job-4", "alice", 1, 0, 4)};
  view.usage = {{"alice", 500.0}, {"bob", 10.0}};
  // carol's priority first; bob used less than alice; alice's own in order.
  EXPECT_EQ(Ids(Decide(view, {})),
            (std::vector<std::string>{"job-3", "job-2", "job-1", "job-4"}));
}

TEST(Decide, StartsWhatFitsInOrderAndSaysWhyTheRestWait) {
  ClusterView view = Cluster(8, 4);
  view.running = {Running("job-0", "dave", 4)};
  view.waiting = {Waiting("job-1", "alice", 2, 0, 1), Waiting("job-2", "bob", 16, 0, 2),
                  Waiting("job-3", "bob", 4, 5, 3), Waiting("job-4", "carol", 2, 0, 4)};
  std::vector<Decision> d = Decide(view, {});
  ASSERT_EQ(Ids(d), (std::vector<std::string>{"job-3", "job-1", "job-2", "job-4"}));
  EXPECT_EQ(d[0].action, Action::kStart);
  // job-3 took the 4 free: job-1 is the first that does not fit.
  EXPECT_EQ(d[1].action, Action::kWait);
  EXPECT_EQ(d[1].reason, "needs 2 gpu, 0 free");
  // Larger than the cluster: waits without holding anyone up.
  EXPECT_EQ(d[2].action, Action::kWait);
  EXPECT_EQ(d[2].reason, "needs 16 gpu, the cluster has 8");
  EXPECT_EQ(d[3].action, Action::kWait);
  EXPECT_EQ(d[3].reason,
            "behind job-1 (priority 0, waiting for 2 gpu); needs 2 gpu, 0 free");
}

TEST(Decide, ALowerPriorityJobSaysWhomItIsBehind) {
  ClusterView view = Cluster(8, 2);
  view.running = {Running("job-0", "dave", 6)};
  view.waiting = {Waiting("job-7", "alice", 4, 5, 7), Waiting("job-8", "bob", 2, 0, 8)};
  std::vector<Decision> d = Decide(view, {.backfill = false});
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[1].job_id, "job-8");
  EXPECT_EQ(d[1].action, Action::kWait);
  EXPECT_EQ(d[1].reason.rfind("priority 0, behind job-7 (priority 5)", 0), 0u) << d[1].reason;
}

TEST(Decide, QuotaHoldsAUserAndNobodyElse) {
  ClusterView view = Cluster(16, 8);
  view.quotas.users[{"alice", "gpu"}] = 8;
  view.running = {Running("job-0", "alice", 8)};
  view.waiting = {Waiting("job-1", "alice", 2, 0, 1), Waiting("job-2", "bob", 4, 0, 2),
                  Waiting("job-3", "alice", 16, 0, 3)};
  auto d = ById(Decide(view, {}));
  EXPECT_EQ(d["job-1"].action, Action::kWait);
  EXPECT_EQ(d["job-1"].reason, "quota: alice holds 8 of 8 gpu, the job needs 2");
  EXPECT_EQ(d["job-2"].action, Action::kStart);  // not held up by alice's quota
  EXPECT_EQ(d["job-3"].reason, "quota: alice may hold 8 gpu, the job needs 16");
}

TEST(Decide, QuotaCountsWhatThisPassStartedAndGroups) {
  ClusterView view = Cluster(16, 16);
  view.quotas.users[{"alice", "gpu"}] = 6;
  view.quotas.groups[{"ml", "gpu"}] = 8;
  view.quotas.group_of = {{"alice", "ml"}, {"bob", "ml"}};
  view.waiting = {Waiting("job-1", "alice", 4, 0, 1), Waiting("job-2", "alice", 4, 0, 2),
                  Waiting("job-3", "bob", 4, 0, 3), Waiting("job-4", "bob", 2, 0, 4),
                  Waiting("job-5", "carol", 8, 0, 5), Waiting("job-6", "alice", 8, 0, 6)};
  auto d = ById(Decide(view, {}));
  EXPECT_EQ(d["job-1"].action, Action::kStart);
  EXPECT_EQ(d["job-2"].reason, "quota: alice holds 4 of 6 gpu, the job needs 4");
  EXPECT_EQ(d["job-3"].action, Action::kStart);
  EXPECT_EQ(d["job-4"].reason, "quota: group ml holds 8 of 8 gpu, the job needs 2");
  EXPECT_EQ(d["job-5"].action, Action::kStart);
  EXPECT_EQ(d["job-6"].reason, "quota: alice may hold 6 gpu, the job needs 8");
}

TEST(Decide, BorrowingUsesIdleQuotaOnlyWhenNobodyWaits) {
  ClusterView view = Cluster(16, 8);
  view.quotas.users[{"alice", "gpu"}] = 8;
  view.running = {Running("job-0", "alice", 8)};
  view.waiting = {Waiting("job-1", "alice", 4, 0, 1)};
  EXPECT_EQ(Decide(view, {}).front().action, Action::kWait);
  Decision borrowed = Decide(view, {.borrowing = true}).front();
  EXPECT_EQ(borrowed.action, Action::kStart);
  EXPECT_TRUE(borrowed.borrowed);
  // Someone ahead waits for the devices: no borrowing.
  view.waiting.push_back(Waiting("job-2", "bob", 12, 1, 2));
  EXPECT_EQ(ById(Decide(view, {.borrowing = true}))["job-1"].action, Action::kWait);
}

TEST(Decide, EasyBackfillDoesNotDelayTheReservedJob) {
  // 8 gpu: job-0 holds 6 and promised to end at t=1000+600. job-1 needs 8:
  // reserved at t=1600 with nothing extra.
  ClusterView view = Cluster(8, 2);
  view.running = {Running("job-0", "dave", 6, 0, 400, 1200)};
  view.waiting = {Waiting("job-1", "alice", 8, 0, 1),
                  Waiting("job-2", "bob", 2, 0, 2, 300),    // ends at 1300 < 1600
                  Waiting("job-3", "bob", 2, 0, 3, 900),    // would end at 1900
                  Waiting("job-4", "carol", 2, 0, 4, 0)};   // no promise
  auto d = ById(Decide(view, {}));
  EXPECT_EQ(d["job-1"].action, Action::kWait);
  EXPECT_DOUBLE_EQ(d["job-1"].reserved_start_s, 1600);
  EXPECT_EQ(d["job-1"].reason, "needs 8 gpu, 2 free; expected to start in 10 min");
  EXPECT_EQ(d["job-2"].action, Action::kBackfill);
  EXPECT_EQ(d["job-3"].action, Action::kWait);
  EXPECT_EQ(d["job-4"].action, Action::kWait);
  // Without backfill the queue is strict.
  EXPECT_EQ(ById(Decide(view, {.backfill = false}))["job-2"].action, Action::kWait);
}

TEST(Decide, ThePlannersPredictionBackfillsLikeAPromiseAndSaysSo) {
  // As above: job-1 reserved at t=1600. job-2 promised nothing, but the
  // planner predicts 300 s: it ends first and backfills; job-3's prediction
  // runs past the reserved start: it waits, saying so.
  ClusterView view = Cluster(8, 2);
  view.running = {Running("job-0", "dave", 6, 0, 400, 1200)};
  WaitingJob short_job = Waiting("job-2", "bob", 2, 0, 3, 300);
  short_job.runtime_predicted = true;
  WaitingJob long_job = Waiting("job-3", "bob", 2, 0, 2, 7200);
  long_job.runtime_predicted = true;
  view.waiting = {Waiting("job-1", "alice", 8, 0, 1), long_job, short_job};
  auto d = ById(Decide(view, {}));
  EXPECT_EQ(d["job-3"].action, Action::kWait);
  EXPECT_EQ(d["job-3"].reason,
            "behind job-1 (priority 0, waiting for 8 gpu); the planner predicts it runs 2.0 h, "
            "past job-1's reserved start");
  EXPECT_EQ(d["job-2"].action, Action::kBackfill);
  EXPECT_EQ(d["job-2"].reason,
            "backfills: ends before job-1's reserved start (the planner predicts 5 min)");
}

TEST(Decide, BackfillMayUseDevicesTheReservedJobDoesNotNeed) {
  // 8 gpu, 4 free; job-0 (4) ends at 1500. job-1 needs 6: at 1500 there are
  // 8, 2 extra. A job without a promise may take those 2, not 3.
  ClusterView view = Cluster(8, 4);
  view.running = {Running("job-0", "dave", 4, 0, 0, 1500)};
  view.waiting = {Waiting("job-1", "alice", 6, 0, 1), Waiting("job-2", "bob", 3, 0, 2),
                  Waiting("job-3", "bob", 2, 0, 3), Waiting("job-4", "carol", 1, 0, 4)};
  auto d = ById(Decide(view, {}));
  EXPECT_EQ(d["job-2"].action, Action::kWait);
  EXPECT_EQ(d["job-3"].action, Action::kBackfill);
  EXPECT_EQ(d["job-3"].reason, "backfills: uses devices job-1 does not need");
  EXPECT_EQ(d["job-4"].action, Action::kWait);  // the extra is used up
}

TEST(Decide, AnUnknownEndReservesNothingToBackfillInto) {
  ClusterView view = Cluster(8, 2);
  view.running = {Running("job-0", "dave", 6)};  // no promised runtime
  view.waiting = {Waiting("job-1", "alice", 8, 0, 1), Waiting("job-2", "bob", 2, 0, 2, 60)};
  auto d = ById(Decide(view, {}));
  EXPECT_TRUE(std::isinf(d["job-1"].reserved_start_s));
  EXPECT_EQ(d["job-2"].action, Action::kWait);
  EXPECT_EQ(d["job-2"].reason,
            "behind job-1 (priority 0, waiting for 8 gpu); would still run at job-1's reserved "
            "start");
}

TEST(Decide, AnUnplaceableJobWaitsAndReserves) {
  ClusterView view = Cluster(8, 4);
  view.waiting = {Waiting("job-1", "alice", 4, 0, 1), Waiting("job-2", "bob", 4, 0, 2)};
  view.waiting[0].unplaceable = true;
  auto d = ById(Decide(view, {.backfill = false}));
  EXPECT_EQ(d["job-1"].action, Action::kWait);
  EXPECT_EQ(d["job-1"].reason, "needs 4 gpu on nodes that hold its layout, 4 free");
  EXPECT_EQ(d["job-2"].action, Action::kWait);
}

TEST(Decide, KindsQueueApart) {
  ClusterView view = Cluster(8, 0);
  view.capacity["cpu"] = 4;
  view.free["cpu"] = 4;
  WaitingJob cpu = Waiting("job-2", "bob", 4, 0, 2);
  cpu.kind = "cpu";
  view.waiting = {Waiting("job-1", "alice", 8, 0, 1), cpu};
  auto d = ById(Decide(view, {}));
  EXPECT_EQ(d["job-1"].action, Action::kWait);
  EXPECT_EQ(d["job-2"].action, Action::kStart);
}

TEST(Victims, LowestPriorityThenLeastWorkLostThenMostRecent) {
  ClusterView view = Cluster(16, 0);
  view.running = {Running("low-old", "a", 4, 0, 100, 0, 5),
                  Running("low-new", "b", 4, 0, 900, 0, 5),
                  Running("low-lost-more", "c", 4, 0, 950, 0, 50),
                  Running("mid", "d", 4, 3, 990, 0, 0)};
  view.waiting = {Waiting("urgent", "e", 4, 5, 1)};
  // One victim is enough: of the priority-0 ones losing least, the newest.
  Decision d = Decide(view, {.preemption = true}).front();
  EXPECT_EQ(d.action, Action::kPreempt);
  EXPECT_EQ(d.victims, (std::vector<std::string>{"low-new"}));
  view.waiting = {Waiting("urgent", "e", 12, 5, 1)};
  d = Decide(view, {.preemption = true}).front();
  EXPECT_EQ(d.victims, (std::vector<std::string>{"low-new", "low-old", "low-lost-more"}));
  // Never a job of equal or higher priority; never more than needed.
  view.waiting = {Waiting("urgent", "e", 16, 3, 1)};
  d = Decide(view, {.preemption = true}).front();
  EXPECT_EQ(d.action, Action::kWait);
  EXPECT_TRUE(d.victims.empty());
  // Without preemption on, nobody is stopped.
  view.waiting = {Waiting("urgent", "e", 4, 5, 1)};
  EXPECT_EQ(Decide(view, {}).front().action, Action::kWait);
}

TEST(Victims, FreeDevicesCountAndStoppingJobsAreNotStoppedTwice) {
  ClusterView view = Cluster(8, 2);
  view.running = {Running("low-a", "a", 2, 0, 100), Running("low-b", "b", 4, 0, 200)};
  view.running[1].stopping = true;  // preempted in an earlier pass
  view.waiting = {Waiting("urgent", "e", 6, 5, 1), Waiting("urgent-2", "f", 2, 5, 2)};
  auto d = ById(Decide(view, {.preemption = true}));
  // 2 free + 4 coming free from low-b: urgent waits for them, stops nobody.
  EXPECT_EQ(d["urgent"].action, Action::kWait);
  EXPECT_EQ(d["urgent"].reason, "waits for 4 gpu of preempted jobs to come free");
  // urgent-2 is behind it (same priority) and nothing is left over.
  EXPECT_EQ(d["urgent-2"].action, Action::kWait);
}

TEST(Victims, AQuotaOwnerReclaimsBorrowedDevicesWhateverTheirPriority) {
  ClusterView view = Cluster(8, 0);
  view.quotas.users[{"alice", "gpu"}] = 8;
  RunningJob borrowed = Running("borrowed", "bob", 8, 9, 100);
  borrowed.borrowed = true;
  view.running = {borrowed};
  view.waiting = {Waiting("mine", "alice", 8, 0, 1)};
  Decision d = Decide(view, {.preemption = true}).front();
  EXPECT_EQ(d.action, Action::kPreempt);
  EXPECT_EQ(d.victims, (std::vector<std::string>{"borrowed"}));
}

TEST(Victims, AJobThatCannotSaveItsStepIsNeverAVictim) {
  ClusterView view = Cluster(8, 0);
  view.running = {Running("unsaved", "a", 4, 0, 900), Running("saves", "b", 4, 0, 100)};
  view.running[0].preemptible = false;  // no checkpoint.dir
  view.waiting = {Waiting("urgent", "e", 4, 5, 1)};
  Decision d = Decide(view, {.preemption = true}).front();
  EXPECT_EQ(d.victims, (std::vector<std::string>{"saves"}));  // though the newer is "unsaved"
  view.waiting = {Waiting("urgent", "e", 8, 5, 1)};
  EXPECT_EQ(Decide(view, {.preemption = true}).front().action, Action::kWait);
}

TEST(Decide, TheWorkedExampleOfDocsScheduling) {
  ClusterView view = Cluster(8, 2);
  view.running = {Running("job-1", "bob", 6, 0, 1000 - 600, 1200)};
  view.waiting = {Waiting("job-2", "alice", 8, 0, 2), Waiting("job-3", "carol", 2, 0, 3, 300),
                  Waiting("job-4", "carol", 2, 0, 4, 900), Waiting("job-5", "dave", 4, 3, 5)};
  std::vector<Decision> d = Decide(view, {});
  ASSERT_EQ(Ids(d), (std::vector<std::string>{"job-5", "job-2", "job-3", "job-4"}));
  EXPECT_EQ(d[0].action, Action::kWait);
  EXPECT_DOUBLE_EQ(d[0].reserved_start_s, 1600);
  EXPECT_EQ(d[1].reason, "priority 0, behind job-5 (priority 3); needs 8 gpu, 2 free");
  EXPECT_EQ(d[2].action, Action::kBackfill);
  EXPECT_EQ(d[3].action, Action::kWait);
}

TEST(FairShare, UsageDecaysWithItsHalfLife) {
  FairShareLedger ledger(100);
  ledger.Charge("alice", 800, 0);
  EXPECT_DOUBLE_EQ(ledger.UsageAt("alice", 0), 800);
  EXPECT_NEAR(ledger.UsageAt("alice", 100), 400, 1e-9);
  EXPECT_NEAR(ledger.UsageAt("alice", 300), 100, 1e-9);
  ledger.Charge("alice", 50, 100);
  EXPECT_NEAR(ledger.UsageAt("alice", 100), 450, 1e-9);
  EXPECT_EQ(ledger.UsageAt("bob", 100), 0);
  EXPECT_EQ(ledger.UsageAt(100).size(), 1u);
}

TEST(FairShare, EqualPrioritiesServeTheLighterUserFirst) {
  FairShareLedger ledger(3600);
  ledger.Charge("alice", 8 * 3600, 0);  // 8 devices for an hour
  ledger.Charge("bob", 1 * 3600, 0);
  ClusterView view = Cluster(8, 4);
  view.usage = ledger.UsageAt(7200);
  view.waiting = {Waiting("job-1", "alice", 4, 0, 1), Waiting("job-2", "bob", 4, 0, 2)};
  std::vector<Decision> d = Decide(view, {});
  EXPECT_EQ(d[0].job_id, "job-2");
  EXPECT_EQ(d[0].action, Action::kStart);
  EXPECT_EQ(d[1].action, Action::kWait);
}

}  // namespace
}  // namespace loom::coordinator::sched
