// Translation between job specs and planner requests.
#include "planner/plan_request.h"

#include "absl/strings/str_cat.h"

namespace loom::planner {

absl::StatusOr<ClusterSpec> ClusterForJob(const spec::ResourcesSpec& r,
                                          const ClusterOverrides& overrides) {
  ClusterSpec cluster;
  if (r.device == spec::DeviceKind::kCpu) {
    absl::StatusOr<ClusterSpec> cpu = ClusterPreset("cpu");
    if (!cpu.ok()) return cpu.status();
    cluster = *cpu;
    if (r.ranks < 1) {
      return absl::InvalidArgumentError(absl::StrCat("resources.ranks=", r.ranks, " must be at least 1"));
    }
    // CPU ranks share one host's loopback: treat them as one node.
    cluster.devices_per_node = r.ranks;
    cluster.nodes = 1;
  } else {
    if (r.gpu.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("resources.gpu must name the device (one of: h100-sxm, h200, a100-80gb)"));
    }
    absl::StatusOr<ClusterSpec> gpu = ClusterPreset(r.gpu);
    if (!gpu.ok()) return gpu.status();
    cluster = *gpu;
    if (r.nodes < 1 || r.gpus_per_node < 1) {
      return absl::InvalidArgumentError(absl::StrCat("resources.nodes=", r.nodes, " and resources.gpus_per_node=",
                                                     r.gpus_per_node, " must be at least 1"));
    }
    cluster.nodes = r.nodes;
    cluster.devices_per_node = r.gpus_per_node;
    if (r.host_memory_mb > 0) {
      cluster.host_memory_bytes = static_cast<double>(r.host_memory_mb) * (1 << 20);
    }
  }
  return ApplyOverrides(cluster, overrides);
}

absl::StatusOr<PlanRequest> PlanRequestFromJob(const spec::JobSpec& job,
                                               const ClusterOverrides& overrides) {
  absl::StatusOr<ClusterSpec> cluster = ClusterForJob(job.resources, overrides);
  if (!cluster.ok()) return cluster.status();
  PlanRequest req;
  req.cluster = *cluster;
  if (cluster->is_cpu && job.resources.memory_mb > 0) {  // a CPU rank's memory limit
    req.cluster.memory_bytes = static_cast<double>(job.resources.memory_mb) * (1 << 20);
  }
  req.workload = MakeWorkload(ModelShapeFromSpec(job.model, job.name), job.train.seq_len,
                              job.train.global_batch_size, RecipeForPrecision(job.train.precision));
  req.workload.dp_bucket_bytes = static_cast<double>(job.parallelism.bucket_mb) * (1 << 20);
  req.workload.snapshot_copies = SnapshotCopies(job.fault_tolerance.snapshot_interval);
  req.workload.host_is_device = cluster->is_cpu;
  req.constants = cluster->is_cpu ? CpuEngineConstants() : DefaultConstants();

  const spec::ParallelismSpec& p = job.parallelism;
  SearchSpace& s = req.space;
  s.schedule = p.schedule;
  s.virtual_stages = p.virtual_stages;
  if (!p.auto_all) {
    s.dp = p.dp;
    s.tp = p.tp;
    s.pp = p.pp;
    s.cp = p.cp;
    s.ep = p.ep;
    if (p.zero_stage) s.zero_stage = static_cast<int>(*p.zero_stage);
    // `micro_batch_size: auto` is searched even with every axis given.
    if (!job.train.micro_batch_size_auto) s.micro_batch_size = job.train.micro_batch_size;
    s.recompute = p.recompute;
    s.sequence_parallel = p.sequence_parallel;
  }
  return req;
}

}  // namespace loom::planner
