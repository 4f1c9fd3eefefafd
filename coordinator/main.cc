// loom-coordinator: the control plane of a Loom cluster. Serves JobService,
// NodeService, RankService and AuthService (plus grpc.health.v1, and
// reflection with --reflection) on --listen over mutual TLS (--tls_dir;
// plaintext only with --insecure), Prometheus metrics on --metrics_listen,
// and keeps jobs, user-token hashes and the rank-token key under --state_dir.
// With --state=etcd://... jobs, leadership, the user-token hashes and the
// rank-token key live in etcd instead: several coordinators run, one leads,
// the others stand by (coordinator/ha/, docs/ha.md).
#include <malloc.h>

#include <atomic>
#include <csignal>
#include <filesystem>
#include <cstdio>
#include <memory>
#include <optional>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/cli/parse_flags.h"
#include "common/confine/path_rules.h"
#include "common/confine/uid_range.h"
#include "common/liveness/udp_socket.h"
#include "common/rpc/rpc_settings.h"
#include "common/rpc/tls_flags.h"
#include "common/crypto/crypto.h"
#include "coordinator/auth/rank_token.h"
#include "coordinator/auth/user_tokens.h"
#include "coordinator/cluster/liveness_board.h"
#include "coordinator/cluster/node_registry.h"
#include "coordinator/ha/etcd_client.h"
#include "coordinator/ha/etcd_job_store.h"
#include "coordinator/ha/etcd_target.h"
#include "coordinator/ha/leader_election.h"
#include "coordinator/ha/shared_value.h"
#include "coordinator/ha/standby_service.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/jobs/sqlite_job_store.h"
#include "coordinator/rendezvous/kv_store.h"
#include "coordinator/service/auth_service.h"
#include "coordinator/service/quota_service.h"
#include "coordinator/service/caller_identity.h"
#include "coordinator/service/job_service.h"
#include "coordinator/service/metrics.h"
#include "coordinator/service/liveness_listener.h"
#include "coordinator/service/node_service.h"
#include "coordinator/service/plan_service.h"
#include "coordinator/service/rank_service.h"
#include "coordinator/service/rpc_metrics_interceptor.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "planner/job_planner.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:7070", "host:port of the gRPC API");
ABSL_FLAG(std::string, liveness_listen, "",
          "host:port where agents' liveness beats arrive (UDP, beside the gRPC API; "
          "docs/fault_tolerance.md, \"Lost nodes\"); empty: the host and port of --listen; "
          "none: no liveness path (nodes are heard on their sessions only)");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9464",
          "host:port of the Prometheus endpoint (empty: no metrics endpoint)");
ABSL_FLAG(std::string, state_dir, "",
          "directory of the durable job store and this coordinator's local files (required)");
ABSL_FLAG(std::string, state, "",
          "where jobs and leadership live: empty = SQLite in --state_dir (one coordinator); "
          "etcd://HOST:PORT[,HOST:PORT...]/PREFIX = etcd (several coordinators, one leads)");
ABSL_FLAG(std::string, advertise, "",
          "with --state=etcd://: HOST:PORT clients reach this coordinator at, as standbys name it "
          "(default: --listen)");
ABSL_FLAG(double, leader_lease_s, 5.0,
          "with --state=etcd://: the leader's etcd lease in whole seconds (at least 2); a dead "
          "leader is replaced after this long");
ABSL_FLAG(std::string, etcd_tls_dir, "",
          "with --state=etcd://: directory with ca.crt (the CA of etcd's certificate) and, when etcd "
          "asks for client certificates, tls.crt and tls.key");
ABSL_FLAG(bool, etcd_insecure, false,
          "with --state=etcd://: plaintext gRPC to etcd (a trusted network or loopback only; warns)");
ABSL_FLAG(std::string, data_roots, "",
          "comma-separated directories jobs may read data from; relative data paths resolve "
          "beneath the first (default: <state_dir>/data)");
ABSL_FLAG(std::string, checkpoint_root, "",
          "directory holding every job's checkpoints as <root>/<owner>/<job_id>/ "
          "(default: <state_dir>/checkpoints)");
ABSL_FLAG(std::string, job_uid_range, "",
          "FIRST-LAST: give each job its own uid (and gid) from this range, the same on every "
          "node; agents run its ranks as it with the same --run_as_uid_range (docs/security.md)");
ABSL_FLAG(double, heartbeat_interval_s, 1.0, "how often agents send heartbeats");
ABSL_FLAG(double, node_timeout_s, 5.0,
          "a node silent this long, plus how late heartbeats are being read, is lost");
ABSL_FLAG(double, kill_grace_s, 5.0, "SIGTERM to SIGKILL grace when ranks are stopped");
ABSL_FLAG(double, collective_timeout_s, 60.0, "timeout of every collective on the ranks");
ABSL_FLAG(double, hang_floor_s, 10.0, "calibrated hang timeouts are never shorter than this");
ABSL_FLAG(double, first_step_allowance_s, 120.0,
          "hang timeout before a job's first step (startup, rendezvous, first step)");
ABSL_FLAG(bool, reflection, false, "serve gRPC reflection (shows the whole API to any caller)");
ABSL_FLAG(double, recovery_grace_s, 10.0,
          "after a restart, how long nodes that ran ranks get to reconnect before they are lost");
// Bounds on what clients and nodes may make the coordinator hold (docs/limits.md).
ABSL_FLAG(int64_t, max_spec_bytes, 256 * 1024, "largest job spec SubmitJob accepts, in bytes");
ABSL_FLAG(int64_t, max_job_ranks, 16384,
          "most ranks one job may ask for (what this cluster could ever give one job)");
ABSL_FLAG(double, job_retention_s, 7 * 24 * 3600.0,
          "finished jobs are deleted this long after they end");
ABSL_FLAG(double, job_metrics_grace_s, 60.0,
          "a job's metric series are removed this long after it ends");
ABSL_FLAG(double, cordon_expiry_s, 3600.0,
          "a cordon that no one lifted (loomctl uncordon) expires after this long; 0: never");
ABSL_FLAG(bool, backfill, true,
          "scheduling: a job may start in a gap before a waiting job's reserved start when it "
          "will not delay it (docs/scheduling.md)");
ABSL_FLAG(bool, preemption, true,
          "scheduling: a job that cannot be placed stops running jobs of lower priority "
          "gracefully (each saves its next step and resumes from it later; docs/scheduling.md)");
ABSL_FLAG(bool, borrowing, false,
          "scheduling: a job over its owner's quota may start on devices nobody waits for; it "
          "is the first preempted when a quota owner needs them (docs/scheduling.md)");
ABSL_FLAG(double, stop_grace_s, 120.0,
          "a graceful stop (preemption, loomctl drain, an agent's SIGTERM) kills the ranks that "
          "have not stopped after this long; the job then resumes from its newest checkpoint");
ABSL_FLAG(double, fair_share_half_life_s, 7 * 24 * 3600.0,
          "scheduling: how fast a user's past device-seconds stop counting in the queue's order");
ABSL_FLAG(int32_t, max_node_devices, 1024, "most devices one node may register");
ABSL_FLAG(int64_t, max_watchers_per_job, 64, "most WatchJob streams on one job at once");
ABSL_FLAG(int64_t, max_log_streams_per_job, 8,
          "most `loomctl logs` streams (StreamLogs) on one job at once");
ABSL_FLAG(double, log_lines_per_second, 5000,
          "most log lines per second one `loomctl logs` stream is sent");
ABSL_FLAG(int64_t, store_max_keys, 65536, "keys per rendezvous namespace");
ABSL_FLAG(int64_t, store_max_value_bytes, 1 << 20, "bytes per rendezvous value");
ABSL_FLAG(int64_t, store_max_namespace_bytes, int64_t{64} << 20,
          "bytes (keys and values) per rendezvous namespace");

namespace {

absl::Notification* g_shutdown = nullptr;
// 1 when this coordinator stops because it no longer leads (crash-only: its
// supervisor restarts it as a standby).
std::atomic<int> g_exit_code{0};
// Set once the job manager exists: a fenced write elsewhere stops it too.
std::atomic<loom::coordinator::JobManager*> g_jobs{nullptr};

void OnSignal(int) {
  if (g_shutdown != nullptr && !g_shutdown->HasBeenNotified()) g_shutdown->Notify();
}

// A write was fenced: another coordinator leads. This one has already stopped
// acting (the job manager refuses and sends nothing more); the process ends
// through the ordinary shutdown, with status 1.
void NoLongerLeading(const absl::Status& why) {
  std::fprintf(stderr, "loom-coordinator: a write was fenced, this coordinator no longer leads "
               "(%s); exiting\n", std::string(why.message()).c_str());
  std::fflush(stderr);
  g_exit_code = 1;
  // At once, not at the shutdown: nothing more reaches an agent.
  if (loom::coordinator::JobManager* jobs = g_jobs.load()) jobs->NoLongerLeading(why);
  OnSignal(0);
}

// Linking gRPC's reflection library registers its plugin with every server
// at static initialisation; this option takes it out again unless
// --reflection asked for it (reflection shows the whole API to any caller).
class WithoutReflection final : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    std::erase_if(*plugins, [](const std::unique_ptr<grpc::ServerBuilderPlugin>& plugin) {
      return plugin->name() == "proto_server_reflection";
    });
  }
};

int Fail(const std::string& message) {
  std::fprintf(stderr, "loom-coordinator: %s\n", message.c_str());
  return 1;
}

// Serves as a standby on --listen (every Loom RPC refused with the leader's
// address, health NOT_SERVING) until election makes this coordinator the
// leader (OK) or shutdown comes (CANCELLED). The leader's server then takes
// the same port.
absl::Status StandBy(std::shared_ptr<grpc::ServerCredentials> credentials,
                     loom::coordinator::ha::LeaderElection* election,
                     const absl::Notification& shutdown) {
  loom::coordinator::ha::StandbyService standby;
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.SetOption(std::make_unique<WithoutReflection>());
  int port = 0;
  builder.AddListeningPort(absl::GetFlag(FLAGS_listen), credentials, &port);
  loom::rpc::ApplyServerSettings(builder);
  builder.RegisterCallbackGenericService(&standby);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on --listen=",
                                               absl::GetFlag(FLAGS_listen),
                                               " (is another coordinator running there?)"));
  }
  server->GetHealthCheckService()->SetServingStatus(false);
  std::printf("loom-coordinator: standing by on %s until this coordinator leads\n",
              absl::GetFlag(FLAGS_listen).c_str());
  std::fflush(stdout);
  absl::Status status = election->Campaign(
      shutdown,
      [&standby](const std::string& leader) {
        standby.SetLeader(leader);
        std::printf("loom-coordinator: standby; leader: %s\n",
                    leader.empty() ? "(none)" : leader.c_str());
        std::fflush(stdout);
      },
      [](const std::string& why) {
        // Crash-only: the term is over and every write of it is refused by
        // etcd anyway; a supervisor restarts this process as a standby.
        std::fprintf(stderr, "loom-coordinator: leadership lost (%s); exiting\n", why.c_str());
        std::fflush(stderr);
        std::_Exit(1);
      });
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
  server->Wait();
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace loom::coordinator;
  // Debian's libabsl is built without NDEBUG, so every Mutex lock feeds a
  // global deadlock-detection graph (GraphCycles: 3-4% of the coordinator's
  // CPU at 4,096 ranks, docs/scale.md). Lock order is checked by the tests.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // Buffers of a megabyte or more (a refused 15 MB spec, a large batch) are
  // mapped and go back to the system when freed. By default glibc raises
  // that threshold after the first such free, and the next ones stay in its
  // heap, in whichever arena the thread used (in one CI run, two refused
  // 15 MB specs left the coordinator 69 MiB larger).
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  const std::vector<std::string> args = loom::cli::ParseFlagsOrExit(
      argc, argv,
      "loom-coordinator --listen=HOST:PORT --metrics_listen=HOST:PORT --state_dir=DIR "
      "(--tls_dir=DIR | --insecure) [--reflection] [--data_roots=DIR[,DIR...]] [--checkpoint_root=DIR] "
      "[--job_uid_range=FIRST-LAST] [--state=etcd://HOST:PORT[,HOST:PORT...]/PREFIX (--etcd_tls_dir=DIR | --etcd_insecure) "
      "[--advertise=HOST:PORT] [--leader_lease_s=S]]");
  if (!args.empty()) loom::cli::UsageError("unexpected argument '" + args.front() + "'");
  const std::string state_dir = absl::GetFlag(FLAGS_state_dir);
  if (state_dir.empty()) loom::cli::UsageError("--state_dir is required");
  if (absl::GetFlag(FLAGS_heartbeat_interval_s) <= 0 || absl::GetFlag(FLAGS_node_timeout_s) <= 0) {
    loom::cli::UsageError("--heartbeat_interval_s and --node_timeout_s must be positive");
  }
  // The agents' lease is the node timeout: a restarted coordinator that
  // declared a node lost sooner could place its ranks' replacements while
  // they still act (docs/fault_tolerance.md, "Fencing").
  if (absl::GetFlag(FLAGS_recovery_grace_s) < absl::GetFlag(FLAGS_node_timeout_s)) {
    loom::cli::UsageError(absl::StrCat(
        "--recovery_grace_s (", absl::GetFlag(FLAGS_recovery_grace_s),
        ") must not be shorter than --node_timeout_s (", absl::GetFlag(FLAGS_node_timeout_s),
        "): a node must not be declared lost after a restart before its agent's lease ran out"));
  }
  absl::StatusOr<loom::rpc::TlsSettings> tls =
      loom::rpc::ResolveTls(loom::rpc::TlsFlagValuesFromFlags());
  if (!tls.ok()) loom::cli::UsageError(std::string(tls.status().message()));
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> server_credentials =
      loom::rpc::ServerCredentials(*tls);
  if (!server_credentials.ok()) loom::cli::UsageError(std::string(server_credentials.status().message()));
  loom::rpc::WarnIfInsecure(*tls, "loom-coordinator");
  if (absl::GetFlag(FLAGS_max_spec_bytes) <= 0 || absl::GetFlag(FLAGS_max_job_ranks) <= 0 ||
      absl::GetFlag(FLAGS_max_node_devices) <= 0 || absl::GetFlag(FLAGS_store_max_keys) <= 0 ||
      absl::GetFlag(FLAGS_max_watchers_per_job) <= 0 ||
      absl::GetFlag(FLAGS_store_max_value_bytes) <= 0 ||
      absl::GetFlag(FLAGS_store_max_namespace_bytes) <= 0) {
    loom::cli::UsageError(
        "--max_spec_bytes, --max_job_ranks, --max_node_devices, --max_watchers_per_job and "
        "--store_max_* must be positive");
  }
  if (!(absl::GetFlag(FLAGS_fair_share_half_life_s) > 0)) {
    loom::cli::UsageError("--fair_share_half_life_s must be positive");
  }
  if (absl::GetFlag(FLAGS_job_retention_s) < 0 || absl::GetFlag(FLAGS_cordon_expiry_s) < 0 ||
      absl::GetFlag(FLAGS_job_metrics_grace_s) < 0) {
    loom::cli::UsageError(
        "--job_retention_s, --job_metrics_grace_s and --cordon_expiry_s must not be negative");
  }

  std::error_code cwd_error;
  const std::string cwd = std::filesystem::current_path(cwd_error).string();
  FileRoots roots;
  if (const std::string flag = absl::GetFlag(FLAGS_data_roots); !flag.empty()) {
    absl::StatusOr<std::vector<std::string>> parsed =
        loom::confine::ParseRoots(flag, cwd, "data_roots");
    if (!parsed.ok()) loom::cli::UsageError(std::string(parsed.status().message()));
    roots.data_roots = *parsed;
  }
  if (const std::string flag = absl::GetFlag(FLAGS_checkpoint_root); !flag.empty()) {
    absl::StatusOr<std::string> parsed = loom::confine::NormalizeRoot(flag, cwd, "checkpoint_root");
    if (!parsed.ok()) loom::cli::UsageError(std::string(parsed.status().message()));
    roots.checkpoint_root = *parsed;
  }
  if (const std::string flag = absl::GetFlag(FLAGS_job_uid_range); !flag.empty()) {
    absl::StatusOr<loom::confine::UidRange> parsed =
        loom::confine::ParseUidRange(flag, "job_uid_range");
    if (!parsed.ok()) loom::cli::UsageError(std::string(parsed.status().message()));
    roots.job_uids = *parsed;
  }

  absl::Notification shutdown;
  g_shutdown = &shutdown;
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);

  absl::StatusOr<std::unique_ptr<CoordinatorMetrics>> metrics =
      CoordinatorMetrics::Create(absl::GetFlag(FLAGS_metrics_listen));
  if (!metrics.ok()) return Fail(std::string(metrics.status().message()));

  // High availability: stand by until this coordinator leads, then keep the
  // jobs in etcd, every write fenced by this term of leadership.
  std::unique_ptr<JobStore> store;
  std::unique_ptr<ha::EtcdClient> etcd;
  std::unique_ptr<ha::LeaderElection> election;
  std::string etcd_prefix;
  if (const std::string state = absl::GetFlag(FLAGS_state); !state.empty()) {
    absl::StatusOr<ha::EtcdTarget> target = ha::ParseEtcdTarget(state);
    if (!target.ok()) loom::cli::UsageError(std::string(target.status().message()));
    const double lease_s = absl::GetFlag(FLAGS_leader_lease_s);
    if (lease_s < 2) loom::cli::UsageError("--leader_lease_s must be at least 2");
    etcd_prefix = target->prefix;
    // TLS to etcd too, unless plaintext is asked for by name: whoever can
    // write there can lead, or forge every job.
    const std::string etcd_tls_dir = absl::GetFlag(FLAGS_etcd_tls_dir);
    if (etcd_tls_dir.empty() == !absl::GetFlag(FLAGS_etcd_insecure)) {
      loom::cli::UsageError(
          "--state=etcd:// needs exactly one of --etcd_tls_dir=DIR (ca.crt[, tls.crt, tls.key]) "
          "and --etcd_insecure");
    }
    absl::StatusOr<loom::rpc::TlsSettings> etcd_tls = loom::rpc::ResolveTls(
        {.tls_dir = etcd_tls_dir,
         .insecure = absl::GetFlag(FLAGS_etcd_insecure),
         .certificate_optional = true});
    if (!etcd_tls.ok()) {
      loom::cli::UsageError(absl::StrCat("--etcd_tls_dir: ", etcd_tls.status().message()));
    }
    if (etcd_tls->insecure) {
      std::fprintf(stderr,
                   "loom-coordinator: WARNING: --etcd_insecure: plaintext to etcd; anyone on "
                   "that network can read jobs and tokens and take leadership\n");
    }
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> etcd_credentials =
        loom::rpc::ChannelCredentials(*etcd_tls);
    if (!etcd_credentials.ok()) {
      loom::cli::UsageError(std::string(etcd_credentials.status().message()));
    }
    etcd = std::make_unique<ha::EtcdClient>(target->endpoints, *etcd_credentials);
    std::string advertise = absl::GetFlag(FLAGS_advertise);
    if (advertise.empty()) advertise = absl::GetFlag(FLAGS_listen);
    election = std::make_unique<ha::LeaderElection>(
        etcd.get(), ha::ElectionOptions{.leader_key = etcd_prefix + "/leader",
                                        .address = advertise,
                                        .lease_ttl = absl::Seconds(static_cast<int64_t>(lease_s))});
    if (absl::Status s = StandBy(*server_credentials, election.get(), shutdown); !s.ok()) {
      if (absl::IsCancelled(s)) return 0;
      return Fail(std::string(s.message()));
    }
    std::printf("loom-coordinator: leading (etcd %s, prefix %s, lease %lld)\n", state.c_str(),
                etcd_prefix.c_str(), static_cast<long long>(election->lease()));
    std::fflush(stdout);
    store = std::make_unique<ha::EtcdJobStore>(etcd.get(), etcd_prefix, election->Fence());
  } else {
    absl::StatusOr<std::unique_ptr<SqliteJobStore>> opened = SqliteJobStore::Open(state_dir);
    if (!opened.ok()) return Fail(std::string(opened.status().message()));
    store = *std::move(opened);
  }

  // Identities: user-token hashes and the rank-token key live in the state dir.
  std::unique_ptr<auth::UserTokenStore> user_tokens;
  std::optional<auth::RankTokenCodec> rank_tokens;
  if (!tls->insecure) {
    // With etcd the hashes live there: a standby that takes over knows every
    // token the leaders before it issued.
    absl::StatusOr<std::unique_ptr<auth::UserTokenStore>> opened;
    if (etcd == nullptr) {
      opened = auth::UserTokenStore::Open(absl::StrCat(state_dir, "/tokens"));
    } else {
      auth::TokenPersistence persistence = ha::EtcdTokenPersistence(
          etcd.get(), etcd_prefix + "/secrets/user_tokens", election->Fence());
      // A fenced token write ends the term as a fenced job write does.
      persistence.save = [save = std::move(persistence.save)](const std::string& text) {
        absl::Status status = save(text);
        if (IsFenced(status)) NoLongerLeading(status);
        return status;
      };
      opened = auth::UserTokenStore::Open(std::move(persistence));
    }
    if (!opened.ok()) return Fail(std::string(opened.status().message()));
    user_tokens = *std::move(opened);
    if (etcd != nullptr) {
      // Every coordinator must verify the rank tokens whichever leader issued.
      absl::StatusOr<std::string> key = ha::LoadOrCreateShared(
          etcd.get(), etcd_prefix + "/secrets/rank_token_key",
          [] { return loom::crypto::RandomBytes(32); });
      if (!key.ok()) return Fail(absl::StrCat("rank token key: ", key.status().message()));
      rank_tokens.emplace(*std::move(key));
    } else {
      absl::StatusOr<auth::RankTokenCodec> codec =
          auth::RankTokenCodec::LoadOrCreate(absl::StrCat(state_dir, "/rank_token.key"));
      if (!codec.ok()) return Fail(std::string(codec.status().message()));
      rank_tokens.emplace(*std::move(codec));
    }
  }
  // Quotas and priority caps (docs/scheduling.md): kept like the token hashes,
  // in the state directory or, with several coordinators, in etcd.
  absl::StatusOr<std::unique_ptr<QuotaBook>> quota_book;
  if (etcd == nullptr) {
    quota_book = QuotaBook::Open(auth::FilePersistence(absl::StrCat(state_dir, "/quotas")));
  } else {
    auth::TokenPersistence persistence =
        ha::EtcdTokenPersistence(etcd.get(), etcd_prefix + "/meta/quotas", election->Fence());
    persistence.save = [save = std::move(persistence.save)](const std::string& text) {
      absl::Status status = save(text);
      if (IsFenced(status)) NoLongerLeading(status);
      return status;
    };
    quota_book = QuotaBook::Open(std::move(persistence));
  }
  if (!quota_book.ok()) return Fail(std::string(quota_book.status().message()));

  const CallerAuth caller_auth(!tls->insecure, user_tokens.get(),
                               rank_tokens.has_value() ? &*rank_tokens : nullptr);

  // Beats on the liveness path, read by a thread of their own (below).
  LivenessBoard liveness_board;
  NodeRegistry nodes;
  nodes.SetLivenessBoard(&liveness_board);
  KvStore kv({.max_keys = absl::GetFlag(FLAGS_store_max_keys),
              .max_value_bytes = absl::GetFlag(FLAGS_store_max_value_bytes),
              .max_namespace_bytes = absl::GetFlag(FLAGS_store_max_namespace_bytes)});
  JobManagerOptions options{.state_dir = state_dir,
                            .kill_grace_seconds = absl::GetFlag(FLAGS_kill_grace_s),
                            .collective_timeout_s = absl::GetFlag(FLAGS_collective_timeout_s),
                            .recovery_grace = absl::Seconds(absl::GetFlag(FLAGS_recovery_grace_s)),
                            .node_timeout = absl::Seconds(absl::GetFlag(FLAGS_node_timeout_s)),
                            .hang_policy = {},
                            .rank_token_issuer = {}};
  if (rank_tokens.has_value()) {
    options.rank_token_issuer = [&rank_tokens](const loom::v1::RankAssignment& a) {
      return rank_tokens->Issue({.job_id = a.job_id(),
                                 .attempt = a.attempt(),
                                 .rank = a.rank(),
                                 .node_id = a.node_id(),
                                 .store_namespace = a.store_namespace()});
    };
  }
  options.max_spec_bytes = absl::GetFlag(FLAGS_max_spec_bytes);
  options.max_job_ranks = absl::GetFlag(FLAGS_max_job_ranks);
  options.scheduling.backfill = absl::GetFlag(FLAGS_backfill);
  options.scheduling.preemption = absl::GetFlag(FLAGS_preemption);
  options.scheduling.borrowing = absl::GetFlag(FLAGS_borrowing);
  if (!(absl::GetFlag(FLAGS_stop_grace_s) > 0)) loom::cli::UsageError("--stop_grace_s must be positive");
  options.stop_grace = absl::Seconds(absl::GetFlag(FLAGS_stop_grace_s));
  options.fair_share_half_life_s = absl::GetFlag(FLAGS_fair_share_half_life_s);
  options.max_watchers_per_job = absl::GetFlag(FLAGS_max_watchers_per_job);
  options.max_launch_bytes = loom::rpc::kMaxMessageBytes;
  options.finished_job_retention = absl::Seconds(absl::GetFlag(FLAGS_job_retention_s));
  options.job_metrics_grace = absl::Seconds(absl::GetFlag(FLAGS_job_metrics_grace_s));
  options.roots = roots;
  absl::StatusOr<std::string> prefix =
      etcd != nullptr ? ha::LoadOrCreateShared(etcd.get(), etcd_prefix + "/meta/job_id_prefix",
                                               [] { return absl::BytesToHexString(loom::crypto::RandomBytes(3)); })
                      : LoadOrCreateJobIdPrefix(state_dir);
  if (!prefix.ok()) return Fail(std::string(prefix.status().message()));
  options.job_id_prefix = *prefix;
  options.hang_policy.floor = absl::Seconds(absl::GetFlag(FLAGS_hang_floor_s));
  options.hang_policy.first_step_allowance =
      absl::Seconds(absl::GetFlag(FLAGS_first_step_allowance_s));
  options.on_fenced = NoLongerLeading;
  options.quota_book = quota_book->get();
  JobManager jobs(options, std::move(store), &nodes, &kv, metrics->get(),
                  loom::planner::ResolveLayout);
  if (absl::Status s = jobs.Recover(); !s.ok()) return Fail(std::string(s.message()));
  g_jobs = &jobs;

  const absl::Duration heartbeat = absl::Seconds(absl::GetFlag(FLAGS_heartbeat_interval_s));
  // Streams opened with user tokens end when those tokens are revoked.
  TokenStreams token_streams;
  // `loomctl logs`: requests to the agents on their sessions, answers back
  // through the node service (coordinator/service/log_relay.h).
  LogRelayOptions log_options;
  log_options.max_streams_per_job = absl::GetFlag(FLAGS_max_log_streams_per_job);
  log_options.lines_per_second = absl::GetFlag(FLAGS_log_lines_per_second);
  if (log_options.max_streams_per_job <= 0 || !(log_options.lines_per_second >= 1)) {
    loom::cli::UsageError("--max_log_streams_per_job and --log_lines_per_second must be positive");
  }
  LogRelay log_relay(
      [&nodes](const std::string& node, const loom::v1::CoordinatorMessage& message) {
        return nodes.Send(node, message);
      },
      [&nodes](const std::string& node) {
        std::optional<NodeInfo> info = nodes.Get(node);
        return info.has_value() && info->live && info->connected;
      },
      log_options);

  JobServiceImpl job_service(&jobs, PlanJob, &caller_auth, {.token_streams = &token_streams});
  job_service.SetLogRelay(&log_relay);
  // `loomctl trace`: TraceStep to the agents, the ranks' traces back through
  // the node service (coordinator/service/trace_relay.h).
  TraceRelay trace_relay([&nodes](const std::string& node, const loom::v1::CoordinatorMessage& message) {
    return nodes.Send(node, message);
  });
  job_service.SetTraceRelay(&trace_relay);
  NodeServiceImpl node_service(&nodes, &jobs, metrics->get(), heartbeat, &caller_auth);
  RankServiceImpl rank_service(&kv, &jobs, &caller_auth);
  AuthServiceImpl auth_service(user_tokens.get(), &caller_auth, &token_streams);
  QuotaServiceImpl quota_service(quota_book->get(), &caller_auth);
  node_service.SetNodeLimits({.max_devices = absl::GetFlag(FLAGS_max_node_devices)});
  node_service.SetAgentLease(absl::Seconds(absl::GetFlag(FLAGS_node_timeout_s)));
  node_service.SetNodeTimeout(absl::Seconds(absl::GetFlag(FLAGS_node_timeout_s)));
  node_service.SetLogRelay(&log_relay);
  node_service.SetTraceRelay(&trace_relay);
  node_service.UpdateNodeGauges();

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  if (absl::GetFlag(FLAGS_reflection)) {
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  } else {
    builder.SetOption(std::make_unique<WithoutReflection>());
  }
  int port = 0;
  builder.AddListeningPort(absl::GetFlag(FLAGS_listen), *server_credentials, &port);
  loom::rpc::ApplyServerSettings(builder);
  builder.RegisterService(&job_service);
  builder.RegisterService(&node_service);
  builder.RegisterService(&rank_service);
  builder.RegisterService(&auth_service);
  builder.RegisterService(&quota_service);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<RpcMetricsInterceptorFactory>(metrics->get()));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return Fail(absl::StrCat("cannot listen on --listen=", absl::GetFlag(FLAGS_listen),
                             " (is another coordinator running there?)"));
  }
  // Liveness on a path nothing else shares (liveness_listener.h). Agents
  // that registered before this is up beat from their next registration.
  std::unique_ptr<LivenessListener> liveness_listener;
  if (const std::string flag = absl::GetFlag(FLAGS_liveness_listen); flag != "none") {
    const std::string where = flag.empty() ? absl::GetFlag(FLAGS_listen) : flag;
    absl::StatusOr<std::string> host = loom::liveness::HostOf(where);
    if (!host.ok()) {
      return Fail(absl::StrCat("--liveness_listen=", where, " is not HOST:PORT or none"));
    }
    int liveness_port = port;  // by default the port gRPC got, as UDP
    if (!flag.empty()) (void)absl::SimpleAtoi(where.substr(where.rfind(':') + 1), &liveness_port);
    absl::StatusOr<std::unique_ptr<LivenessListener>> listener =
        LivenessListener::Start(*host, liveness_port, &liveness_board);
    if (!listener.ok()) {
      return Fail(absl::StrCat("--liveness_listen: ", listener.status().message(),
                               " (set --liveness_listen=HOST:PORT elsewhere, or none)"));
    }
    liveness_listener = *std::move(listener);
    node_service.SetLivenessPort(liveness_listener->port());
  }
  server->GetHealthCheckService()->SetServingStatus(true);
  std::printf("loom-coordinator: serving on %s (port %d, %s), metrics on %s, state in %s\n",
              absl::GetFlag(FLAGS_listen).c_str(), port,
              tls->insecure ? "plaintext" : "mutual TLS",
              absl::GetFlag(FLAGS_metrics_listen).c_str(), state_dir.c_str());
  std::fflush(stdout);

  // Liveness: a node that stops sending heartbeats is lost even if its TCP
  // connection lingers. Hangs and restart backoffs are checked on the same tick.
  const absl::Duration node_timeout = absl::Seconds(absl::GetFlag(FLAGS_node_timeout_s));
  const absl::Duration cordon_expiry = absl::Seconds(absl::GetFlag(FLAGS_cordon_expiry_s));
  std::thread liveness([&] {
    int64_t tick = 0;
    while (!shutdown.WaitForNotificationWithTimeout(absl::Milliseconds(250))) {
      jobs.CheckHealth(absl::Now());
      // Cordons are set by the job manager and lifted by loomctl or expiry:
      // the node gauges follow them once a second.
      if (++tick % 4 == 0) {
        node_service.UpdateNodeGauges();
        metrics->get()->SetLivenessBeats(liveness_board.heard(), liveness_board.refused());
      }
      // The timeout is extended by how late heartbeats are being read, so a
      // backlog of the coordinator's own (a launch burst) loses no node.
      const absl::Time now = absl::Now();
      const absl::Duration backlog = nodes.HeartbeatBacklog(now);
      if (tick % 20 == 0 && backlog > absl::Seconds(1)) {
        std::fprintf(stderr, "loom-coordinator: heartbeats are read %s late; nodes get that much "
                     "longer than --node_timeout_s\n", absl::FormatDuration(absl::Trunc(
                         backlog, absl::Milliseconds(10))).c_str());
      }
      for (const std::string& node : nodes.ExpireSilent(now, node_timeout)) {
        std::optional<loom::coordinator::NodeInfo> info = nodes.Get(node);
        const bool session_ended = info && !info->connected;
        // A backlog under 10 ms is not worth naming (and would print as "0").
        const absl::Duration late = absl::Trunc(backlog, absl::Milliseconds(10));
        const std::string silent = absl::StrCat(
            session_ended ? "its agent's session ended and it did not register again within "
                          : "nothing heard from its agent for ",
            absl::FormatDuration(node_timeout),
            late > absl::ZeroDuration()
                ? absl::StrCat(" and the ", absl::FormatDuration(late),
                               " that heartbeats were being read late")
                : "");
        // For the log only (the job's reason stays short): what the
        // liveness path heard, which tells a silent agent from a blocked path.
        const absl::Time beat = liveness_board.LastBeat(node);
        std::fprintf(stderr, "node %s: %s; node lost (%s)\n", node.c_str(), silent.c_str(),
                     beat == absl::InfinitePast()
                         ? "no liveness beat heard from this session"
                         : absl::StrCat("last liveness beat heard ",
                                        absl::FormatDuration(absl::Trunc(
                                            absl::Now() - beat, absl::Milliseconds(10))),
                                        " ago")
                               .c_str());
        jobs.OnNodeLost(node, silent);
        node_service.UpdateNodeGauges();
      }
      if (cordon_expiry > absl::ZeroDuration()) {
        for (const std::string& node : nodes.ExpireCordons(absl::Now(), cordon_expiry)) {
          std::fprintf(stderr, "node %s: cordon expired after %s\n", node.c_str(),
                       absl::FormatDuration(cordon_expiry).c_str());
          jobs.Schedule();
        }
      }
    }
  });
  shutdown.WaitForNotification();
  std::printf("loom-coordinator: shutting down\n");
  std::fflush(stdout);
  liveness.join();
  liveness_listener.reset();
  // First the jobs stop acting: the node sessions that end with the server
  // below are this coordinator's going, not the nodes' failure, and nothing
  // is decided or stored for them (the ranks train on; the agents reconnect
  // to the next coordinator). What was decided before is stored and sent.
  jobs.Stop();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  g_jobs = nullptr;
  return g_exit_code.load();
}
