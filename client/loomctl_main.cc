// loomctl: the user's client. submit, plan, list, status, watch, cancel talk
// to the coordinator over gRPC; export and plan --offline run locally.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "client/job_format.h"
#include "client/queue_verb.h"
#include "client/quota_verb.h"
#include "common/cli/parse_flags.h"
#include "common/rpc/coordinator_channel.h"
#include "common/rpc/rpc_settings.h"
#include "common/rpc/tls_flags.h"
#include "export/hf_export.h"
#include "loom/v1/auth.grpc.pb.h"
#include "loom/v1/job.grpc.pb.h"
#include "planner/cluster.h"
#include "planner/job_planner.h"
#include "planner/sweep.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:7070",
          "address of loom-coordinator; several comma-separated (a highly available cluster): "
          "loomctl talks to the one that leads");
ABSL_FLAG(std::string, format, "", "output format: plan: text|json; watch: text|jsonl; export: hf");
ABSL_FLAG(bool, offline, false, "plan: run the planner here instead of asking the coordinator");
ABSL_FLAG(int32_t, candidates, 5, "plan: how many layouts to show");
ABSL_FLAG(std::string, profile, "loom",
          "plan: the framework the estimates model: loom (this engine), nanotron or megatron");
ABSL_FLAG(bool, sweep, false,
          "plan: the best layout per (model size, node count) cell, like the Ultra-Scale Playbook");
ABSL_FLAG(std::string, svg, "loom-plan-sweep.svg", "plan --sweep: where to write the heatmap SVG");
ABSL_FLAG(std::string, gpu, "h100-sxm", "plan --sweep: cluster preset");
ABSL_FLAG(double, reconnect_s, 60, "watch: how long to keep reconnecting to a lost coordinator");
ABSL_FLAG(std::string, token_file, "",
          "file holding a bearer token from `loomctl token create` (default: $LOOM_TOKEN)");
ABSL_FLAG(std::string, user, "", "token create|revoke, quota set|get: the user");
ABSL_FLAG(std::string, group, "",
          "quota set|get: the group (with --user: the group the user counts in; none: no group)");
ABSL_FLAG(std::string, gpu_quota, "", "quota set: gpu devices the user or group may hold; none");
ABSL_FLAG(std::string, cpu_quota, "", "quota set: cpu devices the user or group may hold; none");
ABSL_FLAG(std::string, max_priority, "",
          "quota set --user: the highest scheduling.priority the user may ask for; none");

namespace {

using loom::v1::JobService;

constexpr char kUsage[] =
    "loomctl [--coordinator=HOST:PORT[,HOST:PORT...]] submit JOB.yaml | plan JOB.yaml [--offline] "
    "[--format=json] [--profile=loom|nanotron|megatron] | plan --sweep [--svg=FILE] | list | nodes | queue | quota set|get|list | status ID | watch ID [--format=jsonl] | cancel ID | "
    "delete ID | uncordon NODE | export --format=hf CHECKPOINT_DIR OUT_DIR | whoami | token create|revoke --user=NAME; "
    "TLS: --tls_dir=DIR (default $LOOM_TLS_DIR) or --insecure; token: --token_file=F or $LOOM_TOKEN";

int Fail(const std::string& message, int code = 1) {
  std::fprintf(stderr, "loomctl: %s\n", message.c_str());
  return code;
}

// An RPC error in words; an unreachable coordinator says how to start one.
int RpcFail(const grpc::Status& status) {
  const std::string address = absl::GetFlag(FLAGS_coordinator);
  if (loom::rpc::SplitAddresses(address).size() > 1 &&
      (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
       status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED)) {
    return Fail(absl::StrCat("none of the coordinators at ", address, " leads or answers (",
                             status.error_message(), ")"));
  }
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
      status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    return Fail(absl::StrCat("cannot reach the coordinator at ", address, " (",
                             status.error_message(),
                             "). Start one with: build/bin/loom-coordinator --listen=", address,
                             " --state_dir=DIR, or pass --coordinator=HOST:PORT"));
  }
  return Fail(status.error_message());
}

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream in(path);
  if (!in) return false;
  std::stringstream buffer;
  buffer << in.rdbuf();
  *out = buffer.str();
  return true;
}

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

// The bearer token, if any: --token_file, else $LOOM_TOKEN.
std::string BearerToken() {
  const std::string path = absl::GetFlag(FLAGS_token_file);
  if (path.empty()) return Env("LOOM_TOKEN");
  std::string token;
  if (!ReadFile(path, &token)) loom::cli::UsageError("--token_file: cannot read " + path);
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r' || token.back() == ' ')) {
    token.pop_back();
  }
  return token;
}

// The coordinators, with TLS from the flags or $LOOM_TLS_DIR (a token user
// needs only ca.crt there) and the bearer token on every call.
loom::rpc::CoordinatorChannel& Coordinators() {
  static loom::rpc::CoordinatorChannel* coordinators = [] {
    loom::rpc::TlsFlagValues flags = loom::rpc::TlsFlagValuesFromFlags(Env("LOOM_TLS_DIR"));
    const std::string token = BearerToken();
    flags.certificate_optional = !token.empty();
    absl::StatusOr<loom::rpc::TlsSettings> tls = loom::rpc::ResolveTls(flags);
    if (!tls.ok()) loom::cli::UsageError(std::string(tls.status().message()));
    loom::rpc::WarnIfInsecure(*tls, "loomctl");
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
        loom::rpc::ChannelCredentials(*tls, tls->insecure ? "" : token);
    if (!credentials.ok()) loom::cli::UsageError(std::string(credentials.status().message()));
    return new loom::rpc::CoordinatorChannel(absl::GetFlag(FLAGS_coordinator), *credentials);
  }();
  return *coordinators;
}

// With several coordinators: looks for the leader for up to ~10 s (a standby
// takes over within its lease); false if none leads.
bool FindLeader() {
  loom::rpc::CoordinatorChannel& coordinators = Coordinators();
  if (!coordinators.several()) return true;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!coordinators.FindLeader()) {
    if (std::chrono::steady_clock::now() > give_up) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  return true;
}

// The channel to the coordinator that leads (the only one, or the one
// FindLeader found once per process; Watch looks again after a lost stream).
std::shared_ptr<grpc::Channel> Channel() {
  static const bool found = FindLeader();
  (void)found;  // if none leads, calls go to the first address and say so
  return Coordinators().channel();
}

std::unique_ptr<JobService::Stub> Stub() { return JobService::NewStub(Channel()); }

int Submit(const std::string& path) {
  loom::v1::SubmitJobRequest request;
  if (!ReadFile(path, request.mutable_spec_yaml())) {
    return Fail(absl::StrCat("cannot read job spec ", path));
  }
  request.set_source_name(path);
  request.set_base_dir(std::filesystem::absolute(path).parent_path().string());
  loom::v1::SubmitJobResponse response;
  auto context = loom::rpc::UnaryContext();
  grpc::Status status = Stub()->SubmitJob(context.get(), request, &response);
  if (!status.ok()) return RpcFail(status);
  std::printf("%s\n", response.job().id().c_str());
  std::fprintf(stderr, "submitted %s (%s): %s\n", response.job().id().c_str(),
               response.job().name().c_str(),
               loom::client::StateName(response.job().state()).c_str());
  return 0;
}

// The coordinator's plan (PlanJob), or --offline the same planner call here
// (planner::PlanJobSpec, which the coordinator's PlanJob runs too).
int Plan(const std::string& path) {
  const std::string format = absl::GetFlag(FLAGS_format);
  if (!format.empty() && format != "text" && format != "json") {
    loom::cli::UsageError("--format=" + format + " is not a plan format (text or json)");
  }
  loom::v1::PlanJobRequest request;
  if (!ReadFile(path, request.mutable_spec_yaml())) {
    return Fail(absl::StrCat("cannot read job spec ", path));
  }
  request.set_source_name(path);
  request.set_max_candidates(absl::GetFlag(FLAGS_candidates));
  request.set_profile(absl::GetFlag(FLAGS_profile));
  std::string text, json;
  if (absl::GetFlag(FLAGS_offline)) {
    loom::planner::PlanOptions options;
    options.profile = request.profile();
    options.max_candidates = request.max_candidates();
    absl::StatusOr<loom::planner::JobPlan> plan =
        loom::planner::PlanJobSpec(request.spec_yaml(), request.source_name(), options);
    if (!plan.ok()) return Fail(std::string(plan.status().message()));
    text = plan->text;
    json = plan->json.dump(2);
  } else {
    loom::v1::PlanJobResponse response;
    auto context = loom::rpc::UnaryContext();
    grpc::Status status = Stub()->PlanJob(context.get(), request, &response);
    if (!status.ok()) return RpcFail(status);
    text = response.text();
    json = response.json();
  }
  if (format == "json") {
    std::printf("%s\n", json.c_str());
  } else {
    std::printf("%s", text.c_str());
  }
  return 0;
}

// The playbook's grid of model sizes and node counts, best layout per cell.
int Sweep() {
  absl::StatusOr<loom::planner::ClusterSpec> cluster =
      loom::planner::ClusterPreset(absl::GetFlag(FLAGS_gpu));
  if (!cluster.ok()) return Fail(std::string(cluster.status().message()));
  absl::StatusOr<loom::planner::SweepResult> result =
      loom::planner::RunSweep(loom::planner::PlaybookSweep(*cluster));
  if (!result.ok()) return Fail(std::string(result.status().message()));
  if (absl::GetFlag(FLAGS_format) == "json") {
    std::printf("%s\n", loom::planner::SweepToJson(*result).dump(2).c_str());
  } else {
    std::printf("%s", loom::planner::RenderSweepTable(*result).c_str());
  }
  const std::string svg = absl::GetFlag(FLAGS_svg);
  std::ofstream out(svg);
  out << loom::planner::RenderSweepSvg(*result);
  if (!out) return Fail(absl::StrCat("cannot write ", svg));
  std::fprintf(stderr, "heatmap written to %s\n", svg.c_str());
  return 0;
}

// Every job, page by page (the coordinator answers at most a page per call).
int List() {
  auto stub = Stub();
  std::vector<loom::v1::Job> jobs;
  loom::v1::ListJobsRequest request;
  request.set_page_size(1000);
  do {
    loom::v1::ListJobsResponse response;
    auto context = loom::rpc::UnaryContext();
    grpc::Status status = stub->ListJobs(context.get(), request, &response);
    if (!status.ok()) return RpcFail(status);
    jobs.insert(jobs.end(), response.jobs().begin(), response.jobs().end());
    request.set_page_token(response.next_page_token());
  } while (!request.page_token().empty());
  std::printf("%s", loom::client::FormatJobTable(jobs).c_str());
  return 0;
}

int Delete(const std::string& id) {
  loom::v1::DeleteJobRequest request;
  request.set_id(id);
  loom::v1::DeleteJobResponse response;
  auto context = loom::rpc::UnaryContext();
  grpc::Status status = Stub()->DeleteJob(context.get(), request, &response);
  if (!status.ok()) return RpcFail(status);
  std::printf("%s deleted\n", id.c_str());
  return 0;
}

int Uncordon(const std::string& node_id) {
  loom::v1::UncordonNodeRequest request;
  request.set_node_id(node_id);
  loom::v1::Node node;
  auto context = loom::rpc::UnaryContext();
  grpc::Status status = Stub()->UncordonNode(context.get(), request, &node);
  if (!status.ok()) return RpcFail(status);
  std::printf("%s uncordoned\n", node.node_id().c_str());
  return 0;
}

int Nodes() {
  loom::v1::ListNodesResponse response;
  auto context = loom::rpc::UnaryContext();
  grpc::Status status = Stub()->ListNodes(context.get(), {}, &response);
  if (!status.ok()) return RpcFail(status);
  std::printf("%s", loom::client::FormatNodeTable({response.nodes().begin(), response.nodes().end()})
                        .c_str());
  return 0;
}

int Status(const std::string& id) {
  loom::v1::GetJobRequest request;
  request.set_id(id);
  request.set_view(loom::v1::JOB_VIEW_FULL);  // status lists every rank's place
  loom::v1::Job job;
  auto context = loom::rpc::UnaryContext();
  grpc::Status status = Stub()->GetJob(context.get(), request, &job);
  if (!status.ok()) return RpcFail(status);
  std::printf("%s", loom::client::FormatJobStatus(job).c_str());
  return 0;
}

int Cancel(const std::string& id) {
  loom::v1::CancelJobRequest request;
  request.set_id(id);
  loom::v1::Job job;
  auto context = loom::rpc::UnaryContext();
  grpc::Status status = Stub()->CancelJob(context.get(), request, &job);
  if (!status.ok()) return RpcFail(status);
  std::printf("%s %s\n", job.id().c_str(), loom::client::StateName(job.state()).c_str());
  return 0;
}

// Streams the job until it ends; survives a coordinator restart by
// reconnecting for up to --reconnect_s. Exit status 0 only for SUCCEEDED.
int Watch(const std::string& id) {
  const std::string format = absl::GetFlag(FLAGS_format);
  if (!format.empty() && format != "text" && format != "jsonl") {
    loom::cli::UsageError("--format=" + format + " is not a watch format (text or jsonl)");
  }
  const bool jsonl = format == "jsonl";
  const bool tty = !jsonl && isatty(STDOUT_FILENO);
  auto stub = Stub();
  int64_t last_step = -1;
  int32_t last_attempt = -1;
  size_t events_seen = 0;
  auto give_up = std::chrono::steady_clock::now();
  bool ever_connected = false;
  while (true) {
    grpc::ClientContext context;
    loom::v1::WatchJobRequest request;
    request.set_id(id);
    auto reader = stub->WatchJob(&context, request);
    loom::v1::WatchJobResponse update;
    loom::v1::JobState state = loom::v1::JOB_STATE_UNSPECIFIED;
    std::string failure;
    while (reader->Read(&update)) {
      ever_connected = true;
      give_up = std::chrono::steady_clock::now() +
                std::chrono::milliseconds(static_cast<int64_t>(1000 * absl::GetFlag(FLAGS_reconnect_s)));
      const loom::v1::Job& job = update.job();
      state = job.state();
      failure = job.failure_reason();
      // Events: the snapshot's history on (re)connect, then each new one.
      for (size_t i = events_seen; i < static_cast<size_t>(job.history_size()); ++i) {
        if (tty) std::printf("\n");
        std::fprintf(jsonl ? stderr : stdout, "%s\n",
                     loom::client::FormatEvent(job.history(i)).c_str());
      }
      events_seen = std::max<size_t>(events_seen, job.history_size());
      // Steps: the backlog of a (re)connect, then each new one; (attempt, step)
      // only grows, so a reconnect's repeats are skipped.
      std::vector<const loom::v1::JobProgress*> steps;
      for (const loom::v1::JobProgress& p : update.backlog()) steps.push_back(&p);
      steps.push_back(update.has_progress() ? &update.progress() : &job.last_progress());
      for (const loom::v1::JobProgress* p : steps) {
        if (p->step() <= 0 || std::pair(p->attempt(), p->step()) <= std::pair(last_attempt, last_step)) {
          continue;
        }
        last_step = p->step();
        last_attempt = p->attempt();
        if (jsonl) {
          std::printf("%s\n", loom::client::FormatProgressJson(*p).c_str());
        } else if (tty) {
          std::printf("\r\033[K%s", loom::client::FormatProgressLine(*p).c_str());
        } else {
          std::printf("%s\n", loom::client::FormatProgressLine(*p).c_str());
        }
      }
      std::fflush(stdout);
    }
    grpc::Status status = reader->Finish();
    if (tty) std::printf("\n");
    if (status.ok() && state != loom::v1::JOB_STATE_UNSPECIFIED) {
      std::fprintf(stderr, "%s ended %s%s%s\n", id.c_str(), loom::client::StateName(state).c_str(),
                   failure.empty() ? "" : ": ", failure.c_str());
      return state == loom::v1::SUCCEEDED ? 0 : 1;
    }
    const bool retryable = status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                           status.error_code() == grpc::StatusCode::CANCELLED ||
                           status.error_code() == grpc::StatusCode::INTERNAL;
    if (!ever_connected || !retryable || std::chrono::steady_clock::now() > give_up) {
      return RpcFail(status);
    }
    std::fprintf(stderr, "lost the coordinator (%s); reconnecting\n", status.error_message().c_str());
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    if (Coordinators().several()) {
      Coordinators().Failed(status, &context);
      FindLeader();
      stub = Stub();
    }
  }
}

int WhoAmI() {
  loom::v1::WhoAmIResponse response;
  auto context = loom::rpc::UnaryContext();
  grpc::Status status =
      loom::v1::AuthService::NewStub(Channel())->WhoAmI(context.get(), {}, &response);
  if (!status.ok()) return RpcFail(status);
  std::printf("%s (%s)\n", response.name().c_str(), response.role().c_str());
  return 0;
}

// token create --user=NAME prints the new token (only its hash is kept);
// token revoke --user=NAME ends every token of the user.
int Token(const std::vector<std::string>& args) {
  if (args.size() != 2 || (args[1] != "create" && args[1] != "revoke")) {
    loom::cli::UsageError("token needs create or revoke, and --user=NAME");
  }
  const std::string user = absl::GetFlag(FLAGS_user);
  if (user.empty()) loom::cli::UsageError("token " + args[1] + " needs --user=NAME");
  auto stub = loom::v1::AuthService::NewStub(Channel());
  auto context = loom::rpc::UnaryContext();
  if (args[1] == "create") {
    loom::v1::CreateTokenRequest request;
    request.set_user(user);
    loom::v1::CreateTokenResponse response;
    grpc::Status status = stub->CreateToken(context.get(), request, &response);
    if (!status.ok()) return RpcFail(status);
    std::printf("%s\n", response.token().c_str());
    return 0;
  }
  loom::v1::RevokeTokensRequest request;
  request.set_user(user);
  loom::v1::RevokeTokensResponse response;
  grpc::Status status = stub->RevokeTokens(context.get(), request, &response);
  if (!status.ok()) return RpcFail(status);
  std::printf("revoked %d token(s) of %s\n", response.revoked(), user.c_str());
  return 0;
}

int Export(const std::vector<std::string>& args) {
  const std::string format = absl::GetFlag(FLAGS_format);
  if (format != "hf") loom::cli::UsageError("export needs --format=hf");
  if (args.size() != 3) loom::cli::UsageError("export needs CHECKPOINT_DIR and OUT_DIR");
  absl::Status status = loom::hf_export::ExportHuggingFace(args[1], args[2]);
  if (!status.ok()) return Fail(std::string(status.message()));
  std::printf("exported %s to %s (config.json, model.safetensors)\n", args[1].c_str(),
              args[2].c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args = loom::cli::ParseFlagsOrExit(argc, argv, kUsage);
  if (args.empty()) loom::cli::UsageError("a command is required");
  const std::string& command = args[0];
  auto one_argument = [&](const char* what) -> const std::string& {
    if (args.size() != 2) loom::cli::UsageError(command + " needs " + what);
    return args[1];
  };
  if (command == "submit") return Submit(one_argument("JOB.yaml"));
  if (command == "plan" && absl::GetFlag(FLAGS_sweep)) {
    if (args.size() != 1) loom::cli::UsageError("plan --sweep takes no job spec");
    return Sweep();
  }
  if (command == "plan") return Plan(one_argument("JOB.yaml"));
  if (command == "list") return List();
  if (command == "nodes") return Nodes();
  if (command == "queue") return loom::client::RunQueue(*Stub(), RpcFail);
  if (command == "quota") {
    return loom::client::RunQuota(
        args,
        {.user = absl::GetFlag(FLAGS_user), .group = absl::GetFlag(FLAGS_group),
         .gpu = absl::GetFlag(FLAGS_gpu_quota), .cpu = absl::GetFlag(FLAGS_cpu_quota),
         .max_priority = absl::GetFlag(FLAGS_max_priority)},
        *loom::v1::QuotaService::NewStub(Channel()), RpcFail,
        [](const std::string& m) -> int { loom::cli::UsageError(m); });
  }
  if (command == "status") return Status(one_argument("a job ID"));
  if (command == "watch") return Watch(one_argument("a job ID"));
  if (command == "cancel") return Cancel(one_argument("a job ID"));
  if (command == "delete") return Delete(one_argument("a job ID"));
  if (command == "uncordon") return Uncordon(one_argument("a node id"));
  if (command == "export") return Export(args);
  if (command == "whoami") return WhoAmI();
  if (command == "token") return Token(args);
  loom::cli::UsageError("unknown command '" + command + "'");
}
