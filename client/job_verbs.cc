// loomctl's job verbs: submit, list, status, watch, cancel, delete.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "client/job_format.h"
#include "client/loomctl_context.h"
#include "client/loomctl_verbs.h"
#include "common/rpc/rpc_settings.h"
#include "google/protobuf/util/json_util.h"

ABSL_FLAG(bool, watch, false, "submit: then follow the job like `loomctl watch` until it ends");
ABSL_FLAG(double, reconnect_s, 60, "watch: how long to keep reconnecting to a lost coordinator");

namespace loom::client {
namespace {

std::string ToJson(const google::protobuf::Message& message) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  return json;
}

// Streams the job until it ends; survives a coordinator restart by
// reconnecting for up to --reconnect_s. Exit status 0 only for SUCCEEDED.
int Watch(const std::string& id) {
  const bool jsonl = absl::GetFlag(FLAGS_format) == "jsonl";
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
        std::fprintf(jsonl ? stderr : stdout, "%s\n", FormatEvent(job.history(i)).c_str());
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
          std::printf("%s\n", FormatProgressJson(*p).c_str());
        } else if (tty) {
          std::printf("\r\033[K%s", FormatProgressLine(*p).c_str());
        } else {
          std::printf("%s\n", FormatProgressLine(*p).c_str());
        }
      }
      std::fflush(stdout);
    }
    grpc::Status status = reader->Finish();
    if (tty) std::printf("\n");
    if (status.ok() && state != loom::v1::JOB_STATE_UNSPECIFIED) {
      std::fprintf(stderr, "%s ended %s%s%s\n", id.c_str(), StateName(state).c_str(),
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

}  // namespace

int RunSubmit(const Args& args) {
  if (absl::GetFlag(FLAGS_watch)) RequireFormat("watch", {"text", "jsonl"});
  const std::string& path = args[1];
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
  const bool watch = absl::GetFlag(FLAGS_watch);
  // With --watch stdout is the job's steps; the ID goes with the note.
  if (!watch) std::printf("%s\n", response.job().id().c_str());
  std::fprintf(stderr, "submitted %s (%s): %s\n", response.job().id().c_str(),
               response.job().name().c_str(), StateName(response.job().state()).c_str());
  std::fflush(stdout);
  return watch ? Watch(response.job().id()) : 0;
}

// Every job, page by page (the coordinator answers at most a page per call).
int RunList(const Args&) {
  RequireFormat("list", {"text", "json"});
  auto stub = Stub();
  loom::v1::ListJobsResponse all;
  loom::v1::ListJobsRequest request;
  request.set_page_size(1000);
  do {
    loom::v1::ListJobsResponse response;
    auto context = loom::rpc::UnaryContext();
    grpc::Status status = stub->ListJobs(context.get(), request, &response);
    if (!status.ok()) return RpcFail(status);
    for (loom::v1::Job& job : *response.mutable_jobs()) *all.add_jobs() = std::move(job);
    request.set_page_token(response.next_page_token());
  } while (!request.page_token().empty());
  if (absl::GetFlag(FLAGS_format) == "json") {
    std::printf("%s", ToJson(all).c_str());
  } else {
    std::printf("%s", FormatJobTable({all.jobs().begin(), all.jobs().end()}).c_str());
  }
  return 0;
}

int RunStatus(const Args& args) {
  RequireFormat("status", {"text", "json"});
  loom::v1::GetJobRequest request;
  request.set_id(args[1]);
  request.set_view(loom::v1::JOB_VIEW_FULL);  // status lists every rank's place
  loom::v1::Job job;
  auto context = loom::rpc::UnaryContext();
  grpc::Status status = Stub()->GetJob(context.get(), request, &job);
  if (!status.ok()) return RpcFail(status);
  if (absl::GetFlag(FLAGS_format) == "json") {
    std::printf("%s", ToJson(job).c_str());
  } else {
    std::printf("%s", FormatJobStatus(job).c_str());
  }
  return 0;
}

int RunWatch(const Args& args) {
  RequireFormat("watch", {"text", "jsonl"});
  return Watch(args[1]);
}

int RunCancel(const Args& args) {
  loom::v1::CancelJobRequest request;
  request.set_id(args[1]);
  loom::v1::Job job;
  auto context = loom::rpc::UnaryContext();
  grpc::Status status = Stub()->CancelJob(context.get(), request, &job);
  if (!status.ok()) return RpcFail(status);
  std::printf("%s %s\n", job.id().c_str(), StateName(job.state()).c_str());
  return 0;
}

int RunDelete(const Args& args) {
  loom::v1::DeleteJobRequest request;
  request.set_id(args[1]);
  loom::v1::DeleteJobResponse response;
  auto context = loom::rpc::UnaryContext();
  grpc::Status status = Stub()->DeleteJob(context.get(), request, &response);
  if (!status.ok()) return RpcFail(status);
  std::printf("%s deleted\n", args[1].c_str());
  return 0;
}

}  // namespace loom::client
