// The scheduling run's workload and its rule checks (tools/loadgen/
// sched_workload.h, sched_checks.h): every spec the run submits is valid, no
// job is larger than its owner's quota, and each rule catches what breaks it.
#include "tools/loadgen/sched_checks.h"

#include <string>

#include "common/spec/job_spec_yaml.h"
#include "gtest/gtest.h"
#include "tools/loadgen/sched_workload.h"

namespace loom::loadgen {
namespace {

TEST(SchedWorkload, SpecsAreValidAndNoJobExceedsItsOwnersQuota) {
  SchedWorkloadOptions options;
  options.devices = 32 * 8;
  options.jobs = 200;
  const SchedWorkload w = MakeSchedWorkload(options);
  ASSERT_EQ(w.jobs.size(), 200u);
  EXPECT_EQ(w.gpu_quota.at("user-0"), 64);
  EXPECT_EQ(w.gpu_quota.at("user-1"), 32);
  std::map<int64_t, int> priorities;
  for (const SchedJobPlan& j : w.jobs) {
    absl::StatusOr<spec::JobSpec> spec = spec::ParseJobSpecYaml(SchedJobSpec(j), j.name);
    ASSERT_TRUE(spec.ok()) << j.name << ": " << spec.status();
    EXPECT_EQ(spec->train.steps, j.steps);
    EXPECT_EQ(spec->scheduling.priority, j.priority);
    EXPECT_EQ(spec->parallelism.dp, j.devices);
    EXPECT_LE(j.devices, 64);
    if (auto q = w.gpu_quota.find(j.user); q != w.gpu_quota.end()) {
      EXPECT_LE(j.devices, q->second);
    }
    ++priorities[j.priority];
  }
  EXPECT_EQ(priorities.size(), 3u);
  // The same seed, the same jobs.
  EXPECT_EQ(MakeSchedWorkload(options).jobs[17].devices, w.jobs[17].devices);
}

SchedJobOutcome Job(std::string id, std::string user, int64_t priority, int64_t devices,
                    double submit, double start, double end) {
  return {.id = std::move(id),
          .user = std::move(user),
          .priority = priority,
          .devices = devices,
          .submit_s = submit,
          .start_s = start,
          .end_s = end,
          .succeeded = true,
          .attempts = 1};
}

// Two jobs one after the other on an 8-GPU cluster, with the nodes' events.
SchedCheckInput Clean() {
  SchedCheckInput in;
  in.capacity = 8;
  in.gpu_quota = {{"alice", 8}};
  in.jobs = {Job("a", "alice", 0, 8, 0, 1, 3), Job("b", "bob", 0, 8, 0, 3.01, 5)};
  for (int d = 0; d < 8; ++d) {
    in.events.push_back({1.01, "n0", d, "a", true});
    in.events.push_back({2.99, "n0", d, "a", false});
    in.events.push_back({3.02, "n0", d, "b", true});
    in.events.push_back({4.99, "n0", d, "b", false});
  }
  return in;
}

bool Says(const SchedCheckResult& r, const std::string& part) {
  for (const std::string& v : r.violations) {
    if (v.find(part) != std::string::npos) return true;
  }
  return false;
}

TEST(SchedChecks, ACleanRunHoldsEveryRuleAndIsMeasured) {
  const SchedCheckResult r = CheckSchedulingRun(Clean());
  EXPECT_TRUE(r.violations.empty()) << r.violations.front();
  EXPECT_DOUBLE_EQ(r.makespan_s, 5);
  EXPECT_NEAR(r.utilization, (8 * 2 + 8 * 1.99) / 40.0, 1e-9);
  EXPECT_EQ(r.reaction_s.count, 1);  // a's end, b waiting
  EXPECT_NEAR(r.reaction_s.p50, 0.01, 1e-9);
  EXPECT_EQ(r.device_idle_s.count, 8);
  EXPECT_NEAR(r.device_idle_s.max, 0.03, 1e-9);
  EXPECT_NEAR(r.wait_s.max, 3.01, 1e-9);
}

TEST(SchedChecks, OverCapacityOverQuotaAndADeviceGivenTwiceAreCaught) {
  SchedCheckInput in = Clean();
  in.jobs[1].start_s = 2;  // b starts while a holds all 8
  in.events.push_back({2.0, "n0", 3, "b", true});
  SchedCheckResult r = CheckSchedulingRun(in);
  EXPECT_TRUE(Says(r, "b started at 2.000 s with 16 of 8 GPUs held")) << r.violations.front();
  EXPECT_TRUE(Says(r, "device 3 of n0 given to b while a ran there"));

  in = Clean();
  in.capacity = 16;
  in.jobs[1].user = "alice";
  in.jobs[1].start_s = 2;
  r = CheckSchedulingRun(in);
  EXPECT_TRUE(Says(r, "alice holds 16 GPUs, quota 8"));
}

TEST(SchedChecks, ALowerPriorityStartWhileAHigherOneFittedIsCaught) {
  SchedCheckInput in;
  in.capacity = 16;
  in.jobs = {Job("low", "bob", 0, 8, 0, 3, 5), Job("high", "carol", 5, 8, 0, 5, 7)};
  SchedCheckResult r = CheckSchedulingRun(in);
  EXPECT_TRUE(Says(r, "low (priority 0) started at 3.000 s while high (priority 5, 8 GPUs) waited"))
      << (r.violations.empty() ? "" : r.violations.front());
  // Not when high could not fit: 16 GPUs while another job held 8 (the
  // policy backfilled low into the 8 left).
  in.jobs = {Job("run", "dave", 9, 8, 0, 0, 5), Job("low", "bob", 0, 8, 2.9, 3, 5),
             Job("high", "carol", 5, 16, 0, 5, 7)};
  r = CheckSchedulingRun(in);
  EXPECT_TRUE(r.violations.empty()) << r.violations.front();
  // Nor when high's owner was at quota.
  in.capacity = 24;
  in.gpu_quota = {{"carol", 8}};
  in.jobs = {Job("low", "bob", 0, 8, 0, 3, 5), Job("high", "carol", 5, 8, 0, 5, 7),
             Job("carols", "carol", 1, 8, 0, 0, 5)};
  r = CheckSchedulingRun(in);
  EXPECT_TRUE(r.violations.empty()) << r.violations.front();
}

TEST(SchedChecks, AStarvedOrFailedJobIsCaught) {
  SchedCheckInput in = Clean();
  in.jobs[1].start_s = 100;  // waited 100 s behind 16 GPU-seconds of work
  in.jobs[1].end_s = 102;
  SchedCheckResult r = CheckSchedulingRun(in);
  EXPECT_TRUE(Says(r, "b (priority 0, bob) waited 100.0 s, beyond its fair-share bound"))
      << (r.violations.empty() ? "" : r.violations.front());
  EXPECT_GT(r.worst_bound_ratio, 1);

  in = Clean();
  in.jobs[0].succeeded = false;
  in.jobs[1].attempts = 2;
  r = CheckSchedulingRun(in);
  EXPECT_TRUE(Says(r, "a did not succeed in one attempt"));
  EXPECT_TRUE(Says(r, "b did not succeed in one attempt (succeeded, 2 attempts)"));
}

}  // namespace
}  // namespace loom::loadgen
