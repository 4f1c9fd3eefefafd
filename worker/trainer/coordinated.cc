#include "worker/trainer/coordinated.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/spec/job_spec_yaml.h"
#include "worker/comm/group_factory.h"
#include "worker/engine/ops_selection.h"
#include "worker/trainer/agent_control.h"
#include "worker/trainer/control_mailbox.h"
#include "worker/trainer/fault_injection.h"
#include "worker/trainer/gpu_group.h"
#include "worker/trainer/grpc_store.h"
#include "worker/trainer/progress_reporter.h"
#include "worker/trainer/rank_epochs.h"
#include "worker/trainer/stop_signal.h"

namespace loom::trainer {
namespace {

namespace fs = std::filesystem;

std::string Resolve(const std::string& path, const std::string& base) {
  if (path.empty() || fs::path(path).is_absolute() || base.empty()) return path;
  return (fs::path(base) / path).lexically_normal().string();
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
  const int rank = a.rank();
  auto event = [rank](const std::string& message) {
    std::fprintf(stderr, "loom-trainer: rank %d: %s\n", rank, message.c_str());
  };
  // Fault drills of the first attempt only, unless told otherwise; checked
  // here so a bad plan fails at start.
  absl::StatusOr<std::function<void(int64_t)>> fault = InstallFaultPlan(rank, a.attempt());
  if (!fault.ok()) return fault.status();

  // The backend comes first: a GPU job's NCCL groups order their work after
  // its compute stream, and a backend this build cannot make is refused
  // before any group waits for its peers.
  absl::StatusOr<std::shared_ptr<kernels::Ops>> ops = engine::MakeOpsForJob(job, /*local_device=*/0);
  if (!ops.ok()) return ops.status();
  const bool gpu = job.resources.device == spec::DeviceKind::kGpu;
  const absl::Duration timeout =
      absl::Seconds(a.collective_timeout_s() > 0 ? a.collective_timeout_s() : 60);
  const std::string address = a.node_address().empty() ? "127.0.0.1" : a.node_address();

  // Everything goes to the node's agent: the store calls and progress (which
  // it relays to the coordinator), and the control stream it pushes aborts
  // and new attempts on. The rank token says which rank calls.
  ControlMailbox mailbox;
  InstallStopSignal();  // SIGUSR1: stop gracefully at the next step boundary
  AgentControlStream control(agent_socket, a.rank_token(), &mailbox, event);

  RankWorld world;
  world.control = &mailbox;
  world.ops = *ops;
  world.address = address;
  world.on_event = event;
  world.on_step_line = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
  world.open_store = [&agent_socket](const std::string& ns, const std::string& token) {
    return std::unique_ptr<comm::Store>(new GrpcStore(agent_socket, token, ns));
  };
  world.open_progress = [&agent_socket, &a](int attempt, const std::string& token) {
    return std::unique_ptr<ProgressSink>(
        new ProgressReporter(agent_socket, token, a.job_id(), attempt, a.rank()));
  };
  world.make_group = [&, gpu](comm::Store& store, const std::string& axis,
                              const std::vector<int>& members)
      -> absl::StatusOr<std::unique_ptr<comm::Communicator>> {
    if (gpu) return CreateGpuGroup(store, axis, members, rank, timeout, **ops);
    return comm::CreateGroupCommunicator(store, "", axis, members, rank, timeout, address);
  };
  std::function<void(int64_t)> fault_check = *fault;
  world.on_attempt = [&](int attempt, const std::string& token) {
    control.set_rank_token(token);
    if (attempt == a.attempt()) return;  // installed above
    absl::StatusOr<std::function<void(int64_t)>> plan = InstallFaultPlan(rank, attempt);
    fault_check = plan.ok() ? *plan : [](int64_t) {};
  };
  world.after_step = [&fault_check](int64_t step) {
    fault_check(step);
    return absl::OkStatus();
  };
  return RunRankEpochs(a, job, world);
}

}  // namespace loom::trainer
