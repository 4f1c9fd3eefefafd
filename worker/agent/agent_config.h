// loom-worker's command line: the flags, their strict parsing (only
// --name=value of the agent's own flags; anything else is a usage error) and
// the values derived from them (node id, trainer path).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/confine/uid_range.h"
#include "common/rpc/tls.h"
#include "worker/agent/device_probe.h"

namespace loom::agent {

inline constexpr char kAgentUsage[] =
    "usage: loom-worker --coordinator=HOST:PORT[,HOST:PORT...] --devices=cpu:N|gpu --work_dir=DIR "
    "(--tls_dir=DIR | --insecure) [--node_id=ID] [--address=IP] [--trainer=PATH] "
    "[--kill_grace_s=SECONDS] [--data_roots=DIR[,DIR...]] [--checkpoint_root=DIR] "
    "[--run_as_user=USER | --run_as_uid_range=FIRST-LAST] [--progress_batch_ms=MS] [--spare] "
    "[--labels=KEY=VALUE,...] [--drain_grace_s=SECONDS]";

// The flags loom-worker accepts (its --help lists them, common/cli/flag_help.h).
std::vector<std::string> AgentFlagNames();

struct AgentConfig {
  bool help = false;
  std::string coordinator;
  DeviceRequest devices;
  std::string work_dir;  // absolute, normalised
  // With TLS: the CN of the node's certificate (--node_id, if given, must
  // equal it). With --insecure: given, or derived from the host name and work_dir.
  std::string node_id;
  rpc::TlsSettings tls;  // to the coordinator; passed down to every trainer
  std::string address;
  std::string trainer;   // absolute; empty: next to this executable
  double kill_grace_s = 5;
  // SIGTERM drains: the node's jobs stop gracefully and go on elsewhere; the
  // agent waits this long for its ranks to exit before it kills them.
  double drain_grace_s = 120;
  // Confinement (docs/agent.md, "Files and confinement"): ranks read data
  // only beneath data_roots (default <work_dir>/data) and keep checkpoints in
  // <checkpoint_root>/<owner>/<job_id> (default root <work_dir>/checkpoints).
  std::vector<std::string> data_roots;  // absolute, normalised
  std::string checkpoint_root;          // absolute, normalised
  std::string run_as_user;              // empty: ranks run as the agent's user
  // --run_as_uid_range: each job's ranks run as the job's own uid (and gid)
  // from this range, as the coordinator chose it (worker/agent/rank_user.h).
  // Not with run_as_user.
  std::optional<confine::UidRange> run_as_uids;
  // How long a rank's progress report may wait for the node's other ranks'
  // before the agent forwards them in one message.
  int32_t progress_batch_ms = 100;
  // --spare: the node is a cluster spare (RegisterNode.spare).
  bool spare = false;
  // --labels: rack, nvlink_domain, ... (RegisterNode.labels).
  std::map<std::string, std::string> labels;
};

// args excludes the program name. Every flag not given takes its default.
absl::StatusOr<AgentConfig> ParseAgentCommandLine(const std::vector<std::string>& args);

// "<hostname>-<8 hex digits of a hash of work_dir>": stable across restarts
// of the same agent, different for two agents on one host.
std::string DeriveNodeId(const std::string& hostname, const std::string& work_dir);

// loom-trainer in the directory of this process's executable (/proc/self/exe).
std::string DefaultTrainerPath();

std::string HostName();

}  // namespace loom::agent
