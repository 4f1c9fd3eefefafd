// loom-worker: the node agent. Registers this node's devices with the
// coordinator, keeps its session, and runs one loom-trainer per assigned rank.
#include <fcntl.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/cli/flag_help.h"
#include "worker/agent/agent_config.h"
#include "worker/agent/agent_service.h"
#include "worker/agent/device_probe.h"
#include "worker/agent/lease.h"
#include "worker/agent/node_session.h"
#include "worker/agent/rank_control.h"
#include "worker/agent/rank_manager.h"

namespace {

int g_stop_pipe[2] = {-1, -1};

void OnStopSignal(int sig) {
  unsigned char byte = static_cast<unsigned char>(sig);
  (void)!write(g_stop_pipe[1], &byte, 1);
}

// Waits until `ranks` runs nothing, `grace` has passed or another stop
// signal arrives on stop_fd; true in the first case.
bool WaitForRanksToExit(const loom::agent::RankManager& ranks, absl::Duration grace, int stop_fd) {
  const absl::Time deadline = absl::Now() + grace;
  while (!ranks.Running().empty()) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    pollfd fd = {.fd = stop_fd, .events = POLLIN, .revents = 0};
    const int wait_ms =
        static_cast<int>(std::min<int64_t>(200, absl::ToInt64Milliseconds(left) + 1));
    if (poll(&fd, 1, wait_ms) > 0) return false;  // a second signal: stop now
  }
  return true;
}

std::string DescribeDevice(const loom::agent::DeviceInfo& d) {
  return absl::StrFormat("%d x %s '%s', %.1f GiB and %.1f GFLOP/s each", d.count, d.kind, d.name,
                         static_cast<double>(d.memory_bytes) / (1 << 30), d.peak_flops / 1e9);
}

int Main(int argc, char** argv) {
  using namespace loom::agent;
  namespace rpc = loom::rpc;
  absl::StatusOr<AgentConfig> parsed =
      ParseAgentCommandLine(std::vector<std::string>(argv + 1, argv + argc));
  if (!parsed.ok()) {
    fprintf(stderr, "loom-worker: %s; %s\n", std::string(parsed.status().message()).c_str(),
            kAgentUsage);
    return 2;
  }
  const AgentConfig& config = *parsed;
  if (config.help) {
    printf("%s\n\n%s", kAgentUsage,
           loom::cli::RenderFlagHelp(loom::cli::ProgramFlags(AgentFlagNames())).c_str());
    return 0;
  }

  // SIGTERM/SIGINT go through a pipe to the stop thread. A handler rather
  // than sigwait: threads started before main (OpenBLAS's pool) do not have
  // the signals blocked, so a blocked-mask scheme would not hold.
  if (pipe2(g_stop_pipe, O_CLOEXEC) != 0) {
    perror("loom-worker: pipe2");
    return 1;
  }
  struct sigaction on_stop = {};
  on_stop.sa_handler = OnStopSignal;
  sigemptyset(&on_stop.sa_mask);
  on_stop.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &on_stop, nullptr);
  sigaction(SIGINT, &on_stop, nullptr);
  // A batch system's warning before its time limit (Slurm's --signal=USR1@N
  // reaches every process of the step: the agent and its ranks) drains too.
  sigaction(SIGUSR1, &on_stop, nullptr);
  signal(SIGPIPE, SIG_IGN);

  std::error_code error;
  std::filesystem::create_directories(config.work_dir, error);
  if (error || access(config.work_dir.c_str(), W_OK) != 0) {
    fprintf(stderr, "loom-worker: --work_dir=%s cannot be created or is not writable%s%s; %s\n",
            config.work_dir.c_str(), error ? ": " : "", error ? error.message().c_str() : "",
            kAgentUsage);
    return 2;
  }
  const std::string trainer = config.trainer.empty() ? DefaultTrainerPath() : config.trainer;
  if (access(trainer.c_str(), X_OK) != 0) {
    fprintf(stderr,
            "loom-worker: warning: trainer '%s' is not an executable file; every launch will "
            "fail until it is (build loom-trainer or pass --trainer=PATH)\n",
            trainer.c_str());
  }

  absl::StatusOr<std::vector<DeviceInfo>> devices = ProbeDevices(config.devices);
  if (!devices.ok()) {
    fprintf(stderr, "loom-worker: %s\n", std::string(devices.status().message()).c_str());
    return 2;
  }
  int device_count = 0;
  loom::v1::RegisterNode registration;
  registration.set_node_id(config.node_id);
  registration.set_hostname(HostName());
  registration.set_address(config.address);
  registration.set_spare(config.spare);
  registration.mutable_labels()->insert(config.labels.begin(), config.labels.end());
  for (const DeviceInfo& d : *devices) {
    device_count += d.count;
    loom::v1::Device* device = registration.add_devices();
    device->set_kind(d.kind);
    device->set_count(d.count);
    device->set_name(d.name);
    device->set_memory_bytes(d.memory_bytes);
    device->set_peak_flops(d.peak_flops);
    fprintf(stderr, "loom-worker: node %s: %s\n", config.node_id.c_str(),
            DescribeDevice(d).c_str());
  }

  // --run_as_user: ranks run unprivileged. Only root can switch users; an
  // agent that is not root runs its ranks as itself and says so.
  loom::confine::FileOwner run_as;
  if (!config.run_as_user.empty()) {
    struct passwd entry;
    struct passwd* found = nullptr;
    std::vector<char> buffer(16384);
    if (getpwnam_r(config.run_as_user.c_str(), &entry, buffer.data(), buffer.size(), &found) != 0 ||
        found == nullptr) {
      fprintf(stderr, "loom-worker: --run_as_user=%s: no such user; %s\n",
              config.run_as_user.c_str(), kAgentUsage);
      return 2;
    }
    if (found->pw_uid == 0) {
      fprintf(stderr, "loom-worker: --run_as_user=%s is root; name an unprivileged user\n",
              config.run_as_user.c_str());
      return 2;
    }
    if (geteuid() != 0) {
      fprintf(stderr,
              "loom-worker: warning: --run_as_user=%s ignored: the agent is not root, so ranks "
              "run as the agent's own user\n",
              config.run_as_user.c_str());
    } else {
      run_as.uid = found->pw_uid;
      run_as.gid = found->pw_gid;
    }
  }
  // --run_as_uid_range: only root can give each job its own uid; without
  // root the isolation asked for cannot be had, so the agent does not start.
  if (config.run_as_uids.has_value() && geteuid() != 0) {
    fprintf(stderr, "loom-worker: --run_as_uid_range=%s needs an agent running as root; %s\n",
            loom::confine::FormatUidRange(*config.run_as_uids).c_str(), kAgentUsage);
    return 2;
  }
  for (const std::string& root : config.data_roots) {
    std::filesystem::create_directories(root, error);
  }
  std::filesystem::create_directories(config.checkpoint_root, error);

  RankManagerOptions rank_options;
  rank_options.roots.data_roots = config.data_roots;
  rank_options.roots.checkpoint_root = config.checkpoint_root;
  rank_options.roots.rank_owner = run_as;
  rank_options.run_as = run_as;
  rank_options.job_uids = config.run_as_uids;
  rank_options.work_dir = config.work_dir;
  rank_options.trainer_path = trainer;
  rank_options.threads_per_rank = ThreadsPerRank(UsableCores(), device_count);
  rank_options.default_grace = absl::Seconds(config.kill_grace_s);
  rank_options.gpu_devices = config.devices.kind == DeviceRequest::Kind::kGpu;
  absl::StatusOr<std::string> agent_socket = AgentSocketTarget(config.work_dir);
  if (!agent_socket.ok()) {
    fprintf(stderr, "loom-worker: %s; %s\n", std::string(agent_socket.status().message()).c_str(),
            kAgentUsage);
    return 2;
  }
  rank_options.agent_socket = *agent_socket;
  // The lease (docs/fault_tolerance.md, "Fencing") and the ranks' control
  // streams; both outlive everything that uses them below.
  Lease lease;
  RankControlHub control;
  rank_options.lease = &lease;
  rank_options.control = &control;

  // Exits are only reported after a launch, which only the session causes,
  // so the session exists by the time the sink is used.
  std::atomic<NodeSession*> session_ptr{nullptr};
  RankManager ranks(rank_options, [&session_ptr](loom::v1::RankExited exited) {
    if (NodeSession* session = session_ptr.load()) session->ReportExit(std::move(exited));
  });

  NodeSessionOptions session_options;
  session_options.coordinator = config.coordinator;
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      rpc::ChannelCredentials(config.tls);
  if (!credentials.ok()) {
    fprintf(stderr, "loom-worker: %s; %s\n", std::string(credentials.status().message()).c_str(),
            kAgentUsage);
    return 2;
  }
  session_options.credentials = *credentials;
  // One channel for the session and the ranks' relayed store calls: both
  // follow the same leader.
  session_options.coordinators =
      std::make_shared<rpc::CoordinatorChannel>(config.coordinator, *credentials);
  rpc::WarnIfInsecure(config.tls, "loom-worker");
  session_options.registration = registration;
  session_options.progress_batch_window = absl::Milliseconds(config.progress_batch_ms);
  session_options.lease = &lease;
  session_options.read_log = [&ranks](const loom::v1::ReadRankLog& request) {
    return ranks.ReadLog(request);
  };
  NodeSession session(session_options, &ranks);
  session_ptr.store(&session);

  // When the lease runs out the coordinator may have declared this node lost
  // and placed its ranks elsewhere: they stop until it resumes them.
  LeaseWatcher lease_watcher(&lease, [&ranks, &lease] {
    const int paused = ranks.PauseAll();
    fprintf(stderr,
            "loom-worker: lease of %lld ms ran out (no heartbeat or liveness beat acknowledged "
            "in time): paused %d ranks; they stay paused until a coordinator resumes them\n",
            static_cast<long long>(lease.lease_ms()), paused);
  });

  // The ranks' progress comes in on the local socket and leaves in batches
  // on the session.
  // The ranks' store calls are relayed on the session's channel.
  StoreRelay store_relay(session_options.coordinators, StoreRelayOptions{}, &lease);
  AgentServiceImpl agent_service(
      &ranks,
      [&session](loom::v1::RankProgress progress) { session.ReportProgress(std::move(progress)); },
      &store_relay, &control);
  absl::StatusOr<std::unique_ptr<grpc::Server>> agent_server =
      StartAgentServer(*agent_socket,
                       !config.run_as_user.empty() || config.run_as_uids.has_value(),
                       &agent_service);
  if (!agent_server.ok()) {
    fprintf(stderr, "loom-worker: %s\n", std::string(agent_server.status().message()).c_str());
    return 1;
  }

  std::thread signal_thread([&] {
    unsigned char sig = 0;
    while (read(g_stop_pipe[0], &sig, 1) < 0 && errno == EINTR) {
    }
    // SIGTERM (a Kubernetes eviction, a shutdown, Slurm's end of the agent's
    // job) drains: the jobs here stop after their next step, saved, and go
    // on elsewhere (docs/agent.md, "Stopping an agent").
    if ((sig == SIGTERM || sig == SIGUSR1) && config.drain_grace_s > 0) {
      const std::string reason =
          absl::StrCat("the agent of node ", config.node_id, " received ", sigabbrev_np(sig));
      const int told = ranks.StopAll(reason);
      session.Drain(reason);
      fprintf(stderr,
              "loom-worker: SIG%s received; draining: %d ranks stop after their next step "
              "(up to %.0f s; SIGTERM again to stop at once)\n",
              sigabbrev_np(sig), told, config.drain_grace_s);
      if (WaitForRanksToExit(ranks, absl::Seconds(config.drain_grace_s), g_stop_pipe[0])) {
        fprintf(stderr, "loom-worker: every rank stopped\n");
      }
    }
    fprintf(stderr, "loom-worker: %s received; stopping every rank\n", sigabbrev_np(sig));
    ranks.Shutdown(absl::Seconds(config.kill_grace_s));
    session.Shutdown(absl::Seconds(1));
  });

  fprintf(stderr,
          "loom-worker: node %s, coordinator %s, work dir %s, trainer %s, data roots %s, "
          "checkpoint root %s%s%s\n",
          config.node_id.c_str(), config.coordinator.c_str(), config.work_dir.c_str(),
          trainer.c_str(), absl::StrJoin(config.data_roots, ",").c_str(),
          config.checkpoint_root.c_str(),
          run_as.uid != static_cast<uid_t>(-1) ? ", ranks as "
          : config.run_as_uids.has_value()    ? ", ranks as their job's uid from "
                                              : "",
          run_as.uid != static_cast<uid_t>(-1) ? config.run_as_user.c_str()
          : config.run_as_uids.has_value()
              ? loom::confine::FormatUidRange(*config.run_as_uids).c_str()
              : "");
  session.Run();
  signal_thread.join();
  store_relay.Shutdown();  // answers the calls it holds, so the server can stop
  (*agent_server)->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  session_ptr.store(nullptr);
  fprintf(stderr, "loom-worker: stopped\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return Main(argc, argv); }
