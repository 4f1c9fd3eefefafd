// In-place recovery's snapshots in the memory model (docs/planner.md,
// "Snapshots"): each rank keeps six copies of the state it holds (three
// generations of its own snapshot, three of its ward's) whenever
// fault_tolerance.snapshot_interval > 0. On a GPU node they are host memory,
// a figure of their own checked against the node's host memory when the
// cluster gives it; on a CPU rank they are in the rank's memory.
#include <algorithm>
#include <string>
#include <vector>

#include "common/spec/job_spec_yaml.h"
#include "gtest/gtest.h"
#include "planner/job_planner.h"
#include "planner/plan_request.h"
#include "planner/render.h"
#include "planner/search.h"

namespace loom::planner {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

spec::JobSpec GpuJob(int64_t snapshot_interval) {
  spec::JobSpec job;
  job.name = "snap";
  job.data.train_path = "train.bin";
  job.model.vocab_size = 32000;
  job.model.hidden_size = 2048;
  job.model.num_layers = 16;
  job.model.num_heads = 16;
  job.model.num_kv_heads = 8;
  job.model.ffn_hidden_size = 5632;
  job.model.max_seq_len = 2048;
  job.train.seq_len = 2048;
  job.train.global_batch_size = 64;
  job.train.micro_batch_size = 1;
  job.train.eval_interval = 0;
  job.resources.device = spec::DeviceKind::kGpu;
  job.resources.gpu = "h100-sxm";
  job.resources.nodes = 2;
  job.resources.gpus_per_node = 8;
  job.parallelism.auto_all = true;
  job.fault_tolerance.snapshot_interval = snapshot_interval;
  return job;
}

spec::JobSpec CpuJob(int64_t snapshot_interval) {
  spec::JobSpec job = GpuJob(snapshot_interval);
  job.model.vocab_size = 256;
  job.model.hidden_size = 128;
  job.model.num_layers = 4;
  job.model.num_heads = 4;
  job.model.num_kv_heads = 4;
  job.model.ffn_hidden_size = 384;
  job.model.max_seq_len = 256;
  job.train.seq_len = 256;
  job.train.global_batch_size = 8;
  job.resources = {};
  job.resources.ranks = 2;
  return job;
}

TEST(SnapshotCopies, FiveWhenSnapshotting) {
  EXPECT_EQ(SnapshotCopies(0), 0);
  EXPECT_EQ(SnapshotCopies(1), 6);
  EXPECT_EQ(SnapshotCopies(25), 6);
  absl::StatusOr<PlanRequest> on = PlanRequestFromJob(GpuJob(1));
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_EQ(on->workload.snapshot_copies, 6);
  EXPECT_FALSE(on->workload.host_is_device);
  absl::StatusOr<PlanRequest> cpu = PlanRequestFromJob(CpuJob(1));
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_TRUE(cpu->workload.host_is_device);
  absl::StatusOr<PlanRequest> off = PlanRequestFromJob(GpuJob(0));
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(off->workload.snapshot_copies, 0);
}

// A GPU rank's snapshots are the state it holds, six times, in host memory:
// the device's total does not change, the node's host figure is its ranks'.
TEST(SnapshotMemory, GpuSnapshotsAreHostMemoryPerNode) {
  absl::StatusOr<PlanRequest> with = PlanRequestFromJob(GpuJob(1));
  absl::StatusOr<PlanRequest> without = PlanRequestFromJob(GpuJob(0));
  ASSERT_TRUE(with.ok() && without.ok());
  for (int zero : {0, 1, 3}) {
    Layout l;
    l.dp = 8;
    l.tp = 2;
    l.zero_stage = zero;
    l.grad_accum = 8;
    l.sequence_parallel = true;
    const Candidate on = EvaluateLayout(with->workload, with->cluster, with->constants, l);
    const Candidate off = EvaluateLayout(without->workload, without->cluster, without->constants, l);
    EXPECT_DOUBLE_EQ(on.memory.total(), off.memory.total()) << "zero " << zero;
    const double state = on.memory.weights + on.memory.optimizer;
    EXPECT_DOUBLE_EQ(on.memory.snapshots, 6 * state) << "zero " << zero;
    EXPECT_DOUBLE_EQ(on.memory.host_bytes(), 6 * state);
    EXPECT_DOUBLE_EQ(on.host_bytes_per_node, 8 * 6 * state);
    EXPECT_EQ(off.memory.snapshots, 0);
    EXPECT_EQ(off.host_bytes_per_node, 0);
  }
  // ZeRO shards what a snapshot holds.
  Layout l;
  l.dp = 16;
  l.grad_accum = 4;
  const double z0 = EstimateMemory(with->workload, l, with->constants).snapshots;
  l.zero_stage = 3;
  const double z3 = EstimateMemory(with->workload, l, with->constants).snapshots;
  EXPECT_LT(z3, z0 / 8);
}

// Under a pipeline the host figure is the most any stage's rank holds, even
// when another stage decides the device's peak.
TEST(SnapshotMemory, HostFigureIsTheLargestStagesUnderAPipeline) {
  absl::StatusOr<PlanRequest> request = PlanRequestFromJob(GpuJob(1));
  ASSERT_TRUE(request.ok());
  Layout l;
  l.dp = 4;
  l.pp = 4;
  l.grad_accum = 16;
  const Workload& w = request->workload;
  double most = 0;
  for (int64_t stage = 0; stage < l.pp; ++stage) {
    most = std::max(most, EstimateStageMemory(w, l, request->constants, stage).snapshots);
  }
  EXPECT_DOUBLE_EQ(EstimateMemory(w, l, request->constants).snapshots, most);
}

// On a CPU rank host memory is the device: the snapshots count in its total
// and decide what fits.
TEST(SnapshotMemory, CpuSnapshotsCountInTheRanksMemory) {
  absl::StatusOr<PlanRequest> with = PlanRequestFromJob(CpuJob(1));
  absl::StatusOr<PlanRequest> without = PlanRequestFromJob(CpuJob(0));
  ASSERT_TRUE(with.ok() && without.ok());
  Layout l;
  l.dp = 2;
  l.grad_accum = 4;
  const MemoryBreakdown on = EstimateMemory(with->workload, l, with->constants);
  const MemoryBreakdown off = EstimateMemory(without->workload, l, without->constants);
  EXPECT_TRUE(on.snapshots_on_device);
  EXPECT_DOUBLE_EQ(on.snapshots, 6 * (on.weights + on.optimizer));
  EXPECT_DOUBLE_EQ(on.total(), off.total() + on.snapshots);
  EXPECT_EQ(on.host_bytes(), 0);
  EXPECT_EQ(HostBytesPerNode(with->cluster, on), 0);
  // A rank limit between the two: only the job without snapshots fits.
  spec::JobSpec job = CpuJob(1);
  job.parallelism = {};
  job.parallelism.dp = 2;
  job.parallelism.tp = 1;
  job.parallelism.pp = 1;
  job.parallelism.cp = 1;
  job.parallelism.ep = 1;
  job.parallelism.zero_stage = 0;
  job.resources.memory_mb = static_cast<int64_t>((off.total() + on.snapshots / 2) / (1 << 20));
  const absl::Status refused = ResolveLayout(job);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_NE(refused.message().find("snapshots"), std::string::npos) << refused;
  job.fault_tolerance.snapshot_interval = 0;
  EXPECT_TRUE(ResolveLayout(job).ok()) << ResolveLayout(job);
}

// A node's host memory, when the job gives it (resources.host_memory_mb),
// rejects the layouts whose snapshots do not fit it, saying so; the search
// ranks the rest as before and picks the fastest of them.
TEST(SnapshotMemory, HostMemoryBudgetRejectsAndRedirectsTheSearch) {
  absl::StatusOr<PlanRequest> free = PlanRequestFromJob(GpuJob(1));
  ASSERT_TRUE(free.ok());
  absl::StatusOr<PlanResult> unbounded = PlanLayouts(*free);
  ASSERT_TRUE(unbounded.ok() && !unbounded->ranked.empty());
  double least = unbounded->ranked.front().host_bytes_per_node, most = least;
  for (const Candidate& c : unbounded->ranked) {
    least = std::min(least, c.host_bytes_per_node);
    most = std::max(most, c.host_bytes_per_node);
  }
  ASSERT_LT(least, most) << "every layout holds the same state per node";

  spec::JobSpec job = GpuJob(1);
  job.resources.host_memory_mb = static_cast<int64_t>((least + most) / 2 / (1 << 20));
  absl::StatusOr<PlanRequest> bounded = PlanRequestFromJob(job);
  ASSERT_TRUE(bounded.ok());
  const double budget = bounded->cluster.host_memory_bytes;
  EXPECT_DOUBLE_EQ(budget, static_cast<double>(job.resources.host_memory_mb) * (1 << 20));
  absl::StatusOr<PlanResult> r = PlanLayouts(*bounded);
  ASSERT_TRUE(r.ok());
  // What fits is what fitted and holds no more than the budget, in the same order.
  std::vector<Layout> want;
  for (const Candidate& c : unbounded->ranked) {
    if (c.host_bytes_per_node <= budget) want.push_back(c.layout);
  }
  ASSERT_EQ(r->ranked.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(r->ranked[i].layout, want[i]) << i;
  size_t host_rejections = 0;
  for (const Rejection& x : r->rejected) {
    if (x.memory.total() > x.capacity_bytes) continue;  // the device's, as before
    ++host_rejections;
    EXPECT_GT(x.host_bytes_per_node, budget);
    EXPECT_NE(x.Reason().find("out of host memory"), std::string::npos) << x.Reason();
    EXPECT_NE(x.Reason().find("resources.host_memory_mb"), std::string::npos);
  }
  EXPECT_EQ(host_rejections, unbounded->ranked.size() - want.size());
  EXPECT_GT(host_rejections, 0u);
  // Without a budget nothing is rejected for host memory.
  for (const Rejection& x : unbounded->rejected) EXPECT_GT(x.memory.total(), x.capacity_bytes);

  // A budget that no layout fits: submission says why.
  job.resources.host_memory_mb = static_cast<int64_t>(least / 2 / (1 << 20));
  const absl::Status refused = ResolveLayout(job);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_NE(refused.message().find("out of host memory"), std::string::npos) << refused;
}

// `loomctl plan` shows the host figure beside the device's.
TEST(SnapshotMemory, PlanShowsHostMemoryPerNode) {
  spec::JobSpec job = GpuJob(1);
  job.resources.host_memory_mb = 2 << 20;  // 2 TiB
  absl::StatusOr<JobPlan> plan = PlanJobSpec(spec::ToYaml(job), "snap.yaml");
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_NE(plan->text.find("host memory per node:"), std::string::npos) << plan->text;
  EXPECT_NE(plan->text.find("of 2048.0"), std::string::npos) << plan->text;
  EXPECT_NE(plan->text.find("host GiB/node"), std::string::npos) << plan->text;
  const double host = plan->json["best"]["host_bytes_per_node"].get<double>();
  EXPECT_DOUBLE_EQ(host, plan->result.ranked.front().host_bytes_per_node);
  EXPECT_GT(host, 0);
  EXPECT_DOUBLE_EQ(plan->json["cluster"]["host_memory_bytes"].get<double>(), 2048 * kGiB);
  job.fault_tolerance.snapshot_interval = 0;
  plan = PlanJobSpec(spec::ToYaml(job), "snap.yaml");
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->text.find("host memory per node:"), std::string::npos) << plan->text;
}

}  // namespace
}  // namespace loom::planner
