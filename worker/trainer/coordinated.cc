#include "worker/trainer/coordinated.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/spec/job_spec_yaml.h"
#include "common/topology/instruction.h"
#include "proto/group_members.h"
#include "worker/comm/group_factory.h"
#include "worker/comm/self_communicator.h"
#include "worker/engine/ops_selection.h"
#include "worker/engine/training_loop.h"
#include "worker/engine/training_run.h"
#include "worker/trainer/fault_injection.h"
#include "worker/trainer/gpu_group.h"
#include "worker/trainer/grpc_store.h"
#include "worker/trainer/progress_reporter.h"
#include "worker/trainer/rank_monitor.h"

namespace loom::trainer {
namespace {

namespace fs = std::filesystem;

std::string Resolve(const std::string& path, const std::string& base) {
  if (path.empty() || fs::path(path).is_absolute() || base.empty()) return path;
  return (fs::path(base) / path).lexically_normal().string();
}

absl::StatusOr<std::vector<int>> GroupMembers(const loom::v1::RankAssignment& a,
                                              const std::string& axis) {
  for (const auto& group : a.groups()) {
    if (group.axis() == axis) return proto::GroupMemberList(group);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("assignment of rank ", a.rank(), " has no ", axis, " group"));
}

loom::v1::RankProgress ToProto(const engine::StepProgress& p) {
  loom::v1::RankProgress out;
  out.set_phase("step");
  out.set_step(p.step);
  out.set_loss(p.loss);
  if (p.val_loss.has_value()) {
    out.set_has_val_loss(true);
    out.set_val_loss(*p.val_loss);
  }
  out.set_tokens(p.tokens);
  out.set_step_seconds(p.step_seconds);
  out.set_tokens_per_second(p.tokens_per_second);
  // A GPU rank's memory is its device's; a CPU rank's, its resident set.
  out.set_memory_bytes(p.peak_device_bytes > 0 ? p.peak_device_bytes : p.peak_rss_bytes);
  out.set_flops_per_token(p.flops_per_token);
  out.set_lr(p.lr);
  out.set_grad_norm(p.grad_norm);
  if (p.moe) {  // [moe]
    loom::v1::MoeProgress& m = *out.mutable_moe();
    for (double n : p.moe->tokens_per_expert) m.add_tokens_per_expert(n);
    m.set_tokens_min(p.moe->tokens_min);
    m.set_tokens_max(p.moe->tokens_max);
    m.set_imbalance(p.moe->imbalance);
    m.set_dropped_fraction(p.moe->dropped_fraction);
    m.set_aux_loss(p.moe->aux_loss);
  }
  return out;
}

// [pp] The layers the coordinator assigned must be the ones this rank's stage
// derived from the spec (the same partition); an empty list is not checked.
absl::Status CheckStageLayers(const loom::v1::RankAssignment& a, engine::TrainingLoop& loop) {
  if (loop.pipeline_stage() == nullptr || a.layers().empty()) return absl::OkStatus();
  const std::vector<int64_t> mine = engine::StageLayers(loop.pipeline_stage()->plan());
  const std::vector<int64_t> given(a.layers().begin(), a.layers().end());
  if (mine != given) {
    return absl::FailedPreconditionError(absl::StrCat(
        "assignment of rank ", a.rank(), ": layers [", absl::StrJoin(given, ","),
        "] differ from pipeline stage ", loop.pipeline_stage()->plan().stage,
        "'s partition [", absl::StrJoin(mine, ","), "]"));
  }
  // The instruction list the coordinator derived is the one this stage runs.
  const std::string list = topology::FormatInstructions(loop.pipeline_stage()->plan().instructions);
  if (!a.pipeline_instructions().empty() && a.pipeline_instructions() != list) {
    return absl::FailedPreconditionError(absl::StrCat(
        "assignment of rank ", a.rank(), ": pipeline instructions '", a.pipeline_instructions(),
        "' differ from stage ", loop.pipeline_stage()->plan().stage, "'s schedule '", list, "'"));
  }
  std::fprintf(stderr, "loom-trainer: rank %d: pipeline stage %lld, layers [%s], bubble %.3f: %s\n",
               a.rank(), static_cast<long long>(loop.pipeline_stage()->plan().stage),
               absl::StrJoin(mine, ",").c_str(), a.pipeline_bubble_fraction(), list.c_str());
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<loom::v1::RankAssignment> ReadAssignment(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("assignment ", path, ": cannot open the file"));
  loom::v1::RankAssignment assignment;
  if (!assignment.ParseFromIstream(&in)) {
    return absl::DataLossError(absl::StrCat("assignment ", path, ": not a RankAssignment"));
  }
  return assignment;
}

absl::Status RunCoordinated(const loom::v1::RankAssignment& a, const std::string& agent_socket) {
  absl::StatusOr<spec::JobSpec> parsed =
      spec::ParseJobSpecYaml(a.spec_yaml(), absl::StrCat("job ", a.job_id()));
  if (!parsed.ok()) return parsed.status();
  spec::JobSpec job = *std::move(parsed);
  job.data.train_path = Resolve(job.data.train_path, a.data_dir());
  job.data.val_path = Resolve(job.data.val_path, a.data_dir());

  std::fprintf(stderr, "loom-trainer: job %s attempt %d: %s on node %s device %d\n",
               a.job_id().c_str(), a.attempt(), a.place().c_str(), a.node_id().c_str(),
               a.local_device());
  absl::StatusOr<std::function<void(int64_t)>> fault = InstallFaultPlan(a.rank(), a.attempt());
  if (!fault.ok()) return fault.status();
  // Progress and the rendezvous store go to the node's agent, which forwards
  // them to the coordinator (and follows the leader); the rank token says
  // which rank calls.
  ProgressReporter reporter(agent_socket, a.rank_token(), a.job_id(), a.attempt(), a.rank());
  GrpcStore store(agent_socket, a.rank_token(), a.store_namespace());

  // Every rank creates its groups in the same order (tp, then dp), so the
  // rendezvous of one group never waits on a rank still in another's.
  const absl::Duration timeout =
      absl::Seconds(a.collective_timeout_s() > 0 ? a.collective_timeout_s() : 60);
  const std::string address = a.node_address().empty() ? "127.0.0.1" : a.node_address();
  // The backend comes first: a GPU job's NCCL groups order their work after
  // its compute stream, and a backend this build cannot make is refused
  // before any group waits for its peers.
  absl::StatusOr<std::shared_ptr<kernels::Ops>> ops = engine::MakeOpsForJob(job, /*local_device=*/0);
  if (!ops.ok()) return ops.status();
  const bool gpu = job.resources.device == spec::DeviceKind::kGpu;
  auto make_group = [&](const std::string& axis) -> absl::StatusOr<std::unique_ptr<comm::Communicator>> {
    absl::StatusOr<std::vector<int>> members = GroupMembers(a, axis);
    if (!members.ok()) return members.status();
    if (members->size() <= 1) return std::unique_ptr<comm::Communicator>();
    if (gpu) return CreateGpuGroup(store, axis, *members, a.rank(), timeout, **ops);
    return comm::CreateGroupCommunicator(store, "", axis, *members, a.rank(), timeout, address);
  };
  absl::StatusOr<std::unique_ptr<comm::Communicator>> tp = make_group("tp");
  if (!tp.ok()) return tp.status();
  absl::StatusOr<std::unique_ptr<comm::Communicator>> dp = make_group("dp");
  if (!dp.ok()) return dp.status();
  // [pp] The pipeline group (index = stage), created after tp and dp on every rank.
  absl::StatusOr<std::unique_ptr<comm::Communicator>> pp = make_group("pp");
  if (!pp.ok()) return pp.status();
  // [cp] The sequence's ring and the DP x CP group its gradients are reduced
  // over, after pp on every rank; without CP neither exists.
  absl::StatusOr<std::unique_ptr<comm::Communicator>> cp = make_group("cp");
  if (!cp.ok()) return cp.status();
  absl::StatusOr<std::unique_ptr<comm::Communicator>> dp_cp = std::unique_ptr<comm::Communicator>();
  if (*cp != nullptr) dp_cp = make_group("dp_cp");
  if (!dp_cp.ok()) return dp_cp.status();
  // [ep] The expert-parallel group, last (docs/expert_parallel.md).
  absl::StatusOr<std::unique_ptr<comm::Communicator>> ep = make_group("ep");
  if (!ep.ok()) return ep.status();
  const int dp_rank = static_cast<int>(a.coords().dp());
  const int dp_size = static_cast<int>(a.layout().dp() > 0 ? a.layout().dp() : 1);

  // The rank's place in the mesh, built once from the assignment.
  absl::StatusOr<engine::ParallelContext> ctx =
      engine::ParallelContext::Make(dp_rank, dp_size, dp->get(), tp->get(), pp->get(), cp->get(),
                                    dp_cp->get(), ep->get());
  if (!ctx.ok()) return ctx.status();
  absl::StatusOr<std::unique_ptr<engine::TrainingLoop>> loop =
      engine::TrainingLoop::Create(job, *ctx, *ops);
  if (!loop.ok()) return loop.status();
  if (absl::Status s = CheckStageLayers(a, **loop); !s.ok()) return s;  // [pp]
  if (ctx->ep != nullptr) {  // [ep] which experts this rank holds, for its log
    const int64_t held = job.model.moe.num_experts / ctx->ep_size();
    std::fprintf(stderr, "loom-trainer: rank %d: expert parallel: ep rank %d of %d holds experts [%lld, %lld)\n",
                 a.rank(), ctx->ep_rank(), ctx->ep_size(), static_cast<long long>(ctx->ep_rank() * held),
                 static_cast<long long>((ctx->ep_rank() + 1) * held));
  }
  loom::v1::RankProgress ready;
  ready.set_phase("ready");
  reporter.Report(ready);

  PhaseBoard board;
  board.Set("running");
  (*loop)->set_phase_listener(
      [&board](const char* phase, int64_t micro_batch) { board.Set(phase, micro_batch); });
  std::vector<comm::Communicator*> groups;
  for (auto* group : {tp->get(), dp->get(), pp->get(), cp->get(), dp_cp->get(), ep->get()}) {
    if (group != nullptr) groups.push_back(group);
  }
  RankMonitor monitor({.collective_timeout = timeout}, &reporter, &board, groups);

  engine::RunOptions run;
  run.checkpoint_root = a.checkpoint_dir();
  run.resume_from = a.resume_from_dir();
  run.on_event = [&a](const std::string& message) {
    std::fprintf(stderr, "loom-trainer: rank %d: %s\n", a.rank(), message.c_str());
  };
  // The coordinator times a recovery's checkpoint load by these reports.
  run.on_resumed = [&reporter](int64_t step) {
    loom::v1::RankProgress resumed;
    resumed.set_phase("resumed");
    resumed.set_resumed_step(step);
    reporter.Report(resumed);
  };
  run.on_step = [&reporter, &a, &board, &fault](const engine::StepProgress& p) {
    board.SetStep(p.step);
    (*fault)(p.step);
    if (a.rank() == 0) std::fprintf(stderr, "%s\n", engine::FormatProgressLine(p).c_str());
    reporter.Report(ToProto(p));
    return absl::OkStatus();
  };
  absl::Status status = engine::RunTraining(**loop, run);
  if (!status.ok()) return status;
  loom::v1::RankProgress finished;
  finished.set_phase("finished");
  finished.set_step((*loop)->step());
  reporter.Report(finished);
  reporter.Flush(absl::Seconds(10));
  return absl::OkStatus();
}

}  // namespace loom::trainer
