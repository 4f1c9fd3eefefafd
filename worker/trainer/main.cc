// loom-trainer: the training process of one rank.
//   loom-trainer --standalone JOB.yaml [--work_dir=DIR] [--progress_format=text|jsonl]
//                [--stop_after_step=N]          one rank, no coordinator
//   loom-trainer --agent_socket=unix:PATH --assignment=FILE [--work_dir=DIR]
//                                               one rank of a coordinated job (started by loom-worker;
//                                               it talks only to that agent, which relays its
//                                               store calls and progress: no coordinator address,
//                                               no certificate)
// The exit code tells the coordinator what happened (common/exit_codes.h).
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "common/cli/parse_flags.h"
#include "common/exit_codes.h"
#include "worker/trainer/standalone.h"
#ifdef LOOM_TRAINER_WITH_GRPC
#include "worker/trainer/coordinated.h"
#endif

ABSL_FLAG(std::string, standalone, "", "JOB.yaml: train this job as one rank, without a coordinator");
ABSL_FLAG(std::string, assignment, "", "the rank's assignment file written by loom-worker");
ABSL_FLAG(std::string, agent_socket, "",
          "unix:PATH of the node agent's endpoint: progress and the rendezvous store (coordinated "
          "mode; loom-worker passes it)");
ABSL_FLAG(std::string, work_dir, "",
          "directory for run state; in standalone mode a relative checkpoint.dir resolves "
          "against it (default: the spec file's directory)");
ABSL_FLAG(std::string, progress_format, "text", "standalone progress output: text or jsonl");
ABSL_FLAG(int64_t, stop_after_step, 0,
          "standalone: exit after this step as if preempted, writing only the checkpoints due by "
          "then (for drills and tests; 0: train to the end)");

namespace {

constexpr char kUsage[] =
    "loom-trainer --standalone JOB.yaml [--work_dir=DIR] [--progress_format=text|jsonl] "
    "[--stop_after_step=N] | loom-trainer --agent_socket=unix:PATH --assignment=FILE "
    "[--work_dir=DIR]";

int Report(const absl::Status& status) {
  if (!status.ok()) {
    std::fprintf(stderr, "loom-trainer: %s\n", std::string(status.message()).c_str());
  }
  return loom::trainer::ExitCodeFor(status);
}

int RunStandalone(const std::string& spec_path) {
  const std::string format = absl::GetFlag(FLAGS_progress_format);
  if (format != "text" && format != "jsonl") {
    loom::cli::UsageError("--progress_format must be text or jsonl, not " + format);
  }
  loom::trainer::StandaloneOptions options;
  options.spec_path = spec_path;
  options.work_dir = absl::GetFlag(FLAGS_work_dir);
  options.stop_after_step = absl::GetFlag(FLAGS_stop_after_step);
  options.format = format == "jsonl" ? loom::trainer::ProgressFormat::kJsonLines
                                     : loom::trainer::ProgressFormat::kText;
  return Report(loom::trainer::RunStandalone(options));
}

int RunCoordinated(const std::string& assignment_path) {
#ifdef LOOM_TRAINER_WITH_GRPC
  absl::StatusOr<loom::v1::RankAssignment> assignment =
      loom::trainer::ReadAssignment(assignment_path);
  if (!assignment.ok()) return Report(assignment.status());
  return Report(
      loom::trainer::RunCoordinated(*assignment, absl::GetFlag(FLAGS_agent_socket)));
#else
  loom::cli::UsageError("this loom-trainer was built without gRPC: only --standalone works");
#endif
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> rest = loom::cli::ParseFlagsOrExit(argc, argv, kUsage);
  if (!rest.empty()) loom::cli::UsageError("unexpected argument " + rest.front());
  const std::string spec_path = absl::GetFlag(FLAGS_standalone);
  const std::string agent_socket = absl::GetFlag(FLAGS_agent_socket);
  const std::string assignment = absl::GetFlag(FLAGS_assignment);
  if (!spec_path.empty() && !agent_socket.empty()) {
    loom::cli::UsageError("--standalone and --agent_socket exclude each other");
  }
  if (!spec_path.empty()) return RunStandalone(spec_path);
  if (agent_socket.empty() || assignment.empty()) {
    loom::cli::UsageError("give --standalone JOB.yaml, or --agent_socket and --assignment");
  }
  return RunCoordinated(assignment);
}
