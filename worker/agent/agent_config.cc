#include "worker/agent/agent_config.h"

#include <limits.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/cli/closest_name.h"
#include "common/rpc/coordinator_channel.h"
#include "common/rpc/tls_flags.h"
#include "common/confine/path_rules.h"
#include "common/topology/node_labels.h"

ABSL_FLAG(std::string, coordinator, "",
          "HOST:PORT of the coordinator's gRPC endpoint; several comma-separated for a highly "
          "available cluster (the agent and its ranks follow the leader)");
ABSL_FLAG(std::string, devices, "", "cpu:N (N CPU ranks) or gpu (the GPUs nvidia-smi lists)");
ABSL_FLAG(std::string, work_dir, "", "directory for rank assignments and logs");
ABSL_FLAG(std::string, node_id, "", "node id (default: host name and a hash of work_dir)");
ABSL_FLAG(std::string, address, "127.0.0.1", "address this node's ranks listen on");
ABSL_FLAG(std::string, trainer, "", "loom-trainer executable (default: next to loom-worker)");
ABSL_FLAG(double, kill_grace_s, 5, "seconds between SIGTERM and SIGKILL when killing ranks");
ABSL_FLAG(double, drain_grace_s, 120,
          "on SIGTERM, how long the agent waits for its jobs to stop gracefully (each saves "
          "its next step and goes on elsewhere) before it kills what is left; 0: kill at once. "
          "A second SIGTERM, or SIGINT, stops at once");
ABSL_FLAG(std::string, data_roots, "",
          "comma-separated directories ranks may read data from (default: <work_dir>/data)");
ABSL_FLAG(std::string, checkpoint_root, "",
          "directory of job checkpoints, <root>/<owner>/<job_id>/ (default: "
          "<work_dir>/checkpoints)");
ABSL_FLAG(int32_t, progress_batch_ms, 100,
          "longest a rank's progress report waits at the agent, so the reports of one step go "
          "to the coordinator in one message");
ABSL_FLAG(bool, spare, false,
          "offer this node as a cluster spare: no job is placed on it, a rank of a failed node "
          "moves to it (docs/fault_tolerance.md, \"Elastic jobs\")");
ABSL_FLAG(std::string, labels, "",
          "where this node sits in the network, KEY=VALUE,...: rack=R groups a rack's nodes, "
          "nvlink_domain=D the nodes joined by NVLink/NVSwitch (they may hold one TP group "
          "together); placement reads these two (docs/scheduling.md, \"Node labels\")");
ABSL_FLAG(std::string, run_as_user, "",
          "run every rank as this unprivileged user (the agent must run as root)");
ABSL_FLAG(std::string, run_as_uid_range, "",
          "FIRST-LAST: run each job's ranks as the job's own uid and gid from this range, as the "
          "coordinator's --job_uid_range chose it (the same range; the agent must run as root; "
          "not with --run_as_user)");

namespace loom::agent {
namespace {

constexpr const char* kFlagNames[] = {"coordinator",  "devices",    "work_dir",        "node_id",
                                      "address",      "trainer",    "kill_grace_s",    "tls_dir",
                                      "tls_ca",       "tls_cert",   "tls_key",         "insecure",
                                      "data_roots",   "checkpoint_root", "run_as_user",
                                      "progress_batch_ms", "spare", "drain_grace_s",
                                      "run_as_uid_range", "labels"};

}  // namespace

std::vector<std::string> AgentFlagNames() { return {std::begin(kFlagNames), std::end(kFlagNames)}; }

namespace {

absl::Status ValidateHostPort(const std::string& value) {
  size_t colon = value.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(value.substr(colon + 1), &port) || port < 1 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--coordinator='", value, "' must be HOST:PORT with a port from 1 to 65535"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<AgentConfig> ParseAgentCommandLine(const std::vector<std::string>& args) {
  for (const char* name : kFlagNames) {
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    std::string error;
    flag->ParseFrom(flag->DefaultValue(), &error);
  }
  AgentConfig config;
  for (const std::string& arg : args) {
    if (arg == "--help" || arg == "-help" || arg == "-h") {
      config.help = true;
      return config;
    }
    std::string body = arg.rfind("--", 0) == 0 ? arg.substr(2)
                       : arg.rfind("-", 0) == 0 ? arg.substr(1)
                                                : "";
    size_t eq = body.find('=');
    std::string name = body.substr(0, eq);
    bool known = false;
    for (const char* candidate : kFlagNames) known = known || name == candidate;
    if (body.empty() || !known) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown argument '", arg, "'", cli::DidYouMean(name, AgentFlagNames(), "--")));
    }
    if (eq == std::string::npos && (name == "insecure" || name == "spare")) {
      body += "=true";  // the boolean flags
      eq = body.find('=');
    }
    if (eq == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value: --", name, "=..."));
    }
    std::string error;
    if (!absl::FindCommandLineFlag(name)->ParseFrom(body.substr(eq + 1), &error)) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, ": ", error));
    }
  }

  config.coordinator = absl::GetFlag(FLAGS_coordinator);
  if (config.coordinator.empty()) return absl::InvalidArgumentError("--coordinator is required");
  // Several comma-separated addresses: the coordinators of a highly
  // available cluster; the session follows the leader.
  for (const std::string& address : rpc::SplitAddresses(config.coordinator)) {
    if (absl::Status s = ValidateHostPort(address); !s.ok()) return s;
  }

  const std::string devices = absl::GetFlag(FLAGS_devices);
  if (devices.empty()) return absl::InvalidArgumentError("--devices is required");
  absl::StatusOr<DeviceRequest> request = ParseDevicesFlag(devices);
  if (!request.ok()) return request.status();
  config.devices = *request;

  const std::string work_dir = absl::GetFlag(FLAGS_work_dir);
  if (work_dir.empty()) return absl::InvalidArgumentError("--work_dir is required");
  std::error_code error;
  std::filesystem::path absolute = std::filesystem::absolute(work_dir, error);
  if (error) {
    return absl::InvalidArgumentError(
        absl::StrCat("--work_dir='", work_dir, "' cannot be resolved: ", error.message()));
  }
  config.work_dir = absolute.lexically_normal().string();
  if (config.work_dir.size() > 1 && config.work_dir.back() == '/') config.work_dir.pop_back();

  config.address = absl::GetFlag(FLAGS_address);
  if (config.address.empty()) return absl::InvalidArgumentError("--address must not be empty");
  config.trainer = absl::GetFlag(FLAGS_trainer);
  if (!config.trainer.empty()) {
    // Ranks start in their own directories: a relative path would not resolve there.
    std::filesystem::path trainer = std::filesystem::absolute(config.trainer, error);
    if (error) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--trainer='", config.trainer, "' cannot be resolved: ", error.message()));
    }
    config.trainer = trainer.lexically_normal().string();
  }
  config.kill_grace_s = absl::GetFlag(FLAGS_kill_grace_s);
  if (!(config.kill_grace_s >= 0) || config.kill_grace_s > 3600) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--kill_grace_s=", config.kill_grace_s, " must be between 0 and 3600 seconds"));
  }
  config.spare = absl::GetFlag(FLAGS_spare);
  config.drain_grace_s = absl::GetFlag(FLAGS_drain_grace_s);
  if (!(config.drain_grace_s >= 0) || config.drain_grace_s > 86400) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--drain_grace_s=", config.drain_grace_s, " must be between 0 and 86400 seconds"));
  }
  absl::StatusOr<topology::NodeLabels> labels =
      topology::ParseNodeLabels(absl::GetFlag(FLAGS_labels), "--labels");
  if (!labels.ok()) return labels.status();
  config.labels = *std::move(labels);
  config.progress_batch_ms = absl::GetFlag(FLAGS_progress_batch_ms);
  if (config.progress_batch_ms < 0 || config.progress_batch_ms > 10000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--progress_batch_ms=", config.progress_batch_ms, " must be between 0 and 10000"));
  }
  absl::StatusOr<rpc::TlsSettings> tls = rpc::ResolveTls(rpc::TlsFlagValuesFromFlags());
  if (!tls.ok()) return tls.status();
  config.tls = *tls;
  for (std::string* path : {&config.tls.ca_path, &config.tls.cert_path, &config.tls.key_path}) {
    // Trainers start in their own directories: pass them absolute paths.
    if (!path->empty()) *path = std::filesystem::absolute(*path, error).lexically_normal().string();
  }
  const std::string cwd = std::filesystem::current_path(error).string();
  const std::string data_roots = absl::GetFlag(FLAGS_data_roots);
  absl::StatusOr<std::vector<std::string>> roots = confine::ParseRoots(
      data_roots.empty() ? config.work_dir + "/data" : data_roots, cwd, "data_roots");
  if (!roots.ok()) return roots.status();
  config.data_roots = *roots;
  const std::string checkpoint_root = absl::GetFlag(FLAGS_checkpoint_root);
  absl::StatusOr<std::string> root = confine::NormalizeRoot(
      checkpoint_root.empty() ? config.work_dir + "/checkpoints" : checkpoint_root, cwd,
      "checkpoint_root");
  if (!root.ok()) return root.status();
  config.checkpoint_root = *root;
  config.run_as_user = absl::GetFlag(FLAGS_run_as_user);
  if (const std::string range = absl::GetFlag(FLAGS_run_as_uid_range); !range.empty()) {
    if (!config.run_as_user.empty()) {
      return absl::InvalidArgumentError(
          "--run_as_user and --run_as_uid_range exclude each other: ranks run either as one "
          "user or as their job's own uid");
    }
    absl::StatusOr<confine::UidRange> uids = confine::ParseUidRange(range, "run_as_uid_range");
    if (!uids.ok()) return uids.status();
    config.run_as_uids = *uids;
  }
  config.node_id = absl::GetFlag(FLAGS_node_id);
  if (!config.tls.insecure) {
    absl::StatusOr<std::string> name = rpc::CertificateCommonName(config.tls.cert_path);
    if (!name.ok()) return name.status();
    if (!config.node_id.empty() && config.node_id != *name) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--node_id=", config.node_id, " differs from the node certificate's name '", *name,
          "' (with TLS the node id is the certificate's CN; leave --node_id out)"));
    }
    config.node_id = *name;
  }
  if (config.node_id.empty()) config.node_id = DeriveNodeId(HostName(), config.work_dir);
  return config;
}

std::string DeriveNodeId(const std::string& hostname, const std::string& work_dir) {
  uint64_t hash = 1469598103934665603ULL;  // FNV-1a: stable across builds and machines
  for (unsigned char c : work_dir) {
    hash ^= c;
    hash *= 1099511628211ULL;
  }
  return absl::StrFormat("%s-%08x", hostname, static_cast<uint32_t>(hash ^ (hash >> 32)));
}

std::string DefaultTrainerPath() {
  std::error_code error;
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) return "loom-trainer";
  return (self.parent_path() / "loom-trainer").string();
}

std::string HostName() {
  char name[HOST_NAME_MAX + 1] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

}  // namespace loom::agent
