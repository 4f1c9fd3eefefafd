#include "worker/agent/agent_service.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <string_view>

#include "absl/time/clock.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/rpc/progress_batch.h"
#include "common/rpc/store_quotas.h"
#include "common/text/safe_text.h"
#include "grpcpp/security/server_credentials.h"

namespace loom::agent {
namespace {

constexpr std::string_view kBearer = "Bearer ";

constexpr int kMaxRankMessageBytes = static_cast<int>(
    std::max(rpc::StoreQuotas{}.max_value_bytes + rpc::StoreQuotas{}.max_key_bytes,
             rpc::kMaxProgressReportBytes) +
    64 * 1024);

// The bearer token of a call, or "" when it carries none.
std::string_view BearerToken(const grpc::CallbackServerContext& context) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) return {};
  const std::string_view value(it->second.data(), it->second.size());
  if (value.substr(0, kBearer.size()) != kBearer) return {};
  return value.substr(kBearer.size());
}

class ProgressReactor final : public grpc::ServerReadReactor<loom::v1::RankProgress> {
 public:
  ProgressReactor(grpc::CallbackServerContext* context, const RankTokens* tokens,
                  const AgentServiceImpl::Forward* forward)
      : tokens_(tokens), forward_(forward) {
    std::optional<RankIdentity> rank;
    const std::string_view token = BearerToken(*context);
    if (!token.empty()) rank = tokens->RankForToken(token);
    if (!rank) {
      Finish(grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                          "ReportProgress needs 'authorization: Bearer <rank token>' of a rank "
                          "this agent runs"));
      return;
    }
    if (absl::Status paused = CheckNotPaused(*rank); !paused.ok()) {
      Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, std::string(paused.message())));
      return;
    }
    rank_ = *std::move(rank);
    StartRead(&progress_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    // The rank as it is now: its token may have been replaced (EnterEpoch),
    // or the agent's lease may have run out, since the stream opened.
    const std::optional<RankIdentity> now = tokens_->RankForLaunch(rank_.launch_id);
    if (!now || now->attempt != rank_.attempt) {
      Finish(grpc::Status(
          grpc::StatusCode::PERMISSION_DENIED,
          absl::StrCat("the token of job ", rank_.job_id, " attempt ", rank_.attempt, " rank ",
                       rank_.rank, " is no longer current",
                       now ? absl::StrCat(" (the rank is in attempt ", now->attempt,
                                          " now: report with its new token)")
                           : std::string())));
      return;
    }
    if (absl::Status paused = CheckNotPaused(*now); !paused.ok()) {
      // Not forwarded; the trainer keeps the report and sends it again.
      Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, std::string(paused.message())));
      return;
    }
    if (progress_.job_id() != rank_.job_id || progress_.attempt() != rank_.attempt ||
        progress_.rank() != rank_.rank) {
      Finish(grpc::Status(
          grpc::StatusCode::PERMISSION_DENIED,
          absl::StrCat("a report for job ", SafeText(progress_.job_id(), 64), " attempt ",
                       progress_.attempt(),
                       " rank ", progress_.rank(), " on the stream of job ", rank_.job_id,
                       " attempt ", rank_.attempt, " rank ", rank_.rank,
                       ": a rank reports only its own progress")));
      return;
    }
    // Refused here, never forwarded: a rank's oversized reports could
    // otherwise fill its node's batches past the transport limit and make
    // the node's session fail (and every job on the node with it).
    if (const size_t bytes = progress_.ByteSizeLong();
        bytes > static_cast<size_t>(rpc::kMaxProgressReportBytes)) {
      Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          absl::StrCat("a progress report of ", bytes, " bytes; at most ",
                                       rpc::kMaxProgressReportBytes, " are accepted")));
      return;
    }
    (*forward_)(std::move(progress_));
    progress_.Clear();
    StartRead(&progress_);
  }

  void OnDone() override { delete this; }

 private:
  const RankTokens* tokens_;
  const AgentServiceImpl::Forward* forward_;
  RankIdentity rank_;
  loom::v1::RankProgress progress_;
};

// The rank a store call comes from (by its token), or the status that
// refuses it.
grpc::Status StoreCaller(const grpc::CallbackServerContext& context, const RankTokens& tokens,
                         const StoreRelay* store, const char* method, RankIdentity* rank,
                         std::string* token) {
  if (store == nullptr) {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                        "this agent relays no store calls");
  }
  *token = std::string(BearerToken(context));
  std::optional<RankIdentity> found;
  if (!token->empty()) found = tokens.RankForToken(*token);
  if (!found) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrCat(method,
                                     " needs 'authorization: Bearer <rank token>' of a rank this "
                                     "agent runs"));
  }
  // A paused rank's call is refused by the relay (CheckStoreCall).
  *rank = *std::move(found);
  return grpc::Status::OK;
}

}  // namespace

grpc::ServerReadReactor<loom::v1::RankProgress>* AgentServiceImpl::ReportProgress(
    grpc::CallbackServerContext* context, loom::v1::ReportProgressResponse* /*response*/) {
  return new ProgressReactor(context, tokens_, &forward_);
}

grpc::ServerUnaryReactor* AgentServiceImpl::StoreSet(grpc::CallbackServerContext* context,
                                                     const loom::v1::StoreSetRequest* request,
                                                     loom::v1::StoreSetResponse* /*response*/) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  RankIdentity rank;
  std::string token;
  if (grpc::Status s = StoreCaller(*context, *tokens_, store_, "StoreSet", &rank, &token);
      !s.ok()) {
    reactor->Finish(s);
    return reactor;
  }
  store_->Set(rank, token, *request, [reactor](grpc::Status status) { reactor->Finish(status); });
  return reactor;
}

grpc::ServerUnaryReactor* AgentServiceImpl::StoreGet(grpc::CallbackServerContext* context,
                                                     const loom::v1::StoreGetRequest* request,
                                                     loom::v1::StoreGetResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  RankIdentity rank;
  std::string token;
  if (grpc::Status s = StoreCaller(*context, *tokens_, store_, "StoreGet", &rank, &token);
      !s.ok()) {
    reactor->Finish(s);
    return reactor;
  }
  // As the coordinator: no longer than wait_ms, nor past the call's deadline.
  const absl::Time deadline =
      std::min(absl::Now() + absl::Milliseconds(std::max<int64_t>(0, request->wait_ms())),
               absl::FromChrono(context->deadline()));
  store_->Get(rank, token, *request, deadline,
              [reactor, response](grpc::Status status, const std::string& value) {
                if (status.ok()) response->set_value(value);
                reactor->Finish(status);
              });
  return reactor;
}

grpc::ServerUnaryReactor* AgentServiceImpl::StoreAdd(grpc::CallbackServerContext* context,
                                                     const loom::v1::StoreAddRequest* request,
                                                     loom::v1::StoreAddResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  RankIdentity rank;
  std::string token;
  if (grpc::Status s = StoreCaller(*context, *tokens_, store_, "StoreAdd", &rank, &token);
      !s.ok()) {
    reactor->Finish(s);
    return reactor;
  }
  store_->Add(rank, token, *request, [reactor, response](grpc::Status status, int64_t value) {
    if (status.ok()) response->set_value(value);
    reactor->Finish(status);
  });
  return reactor;
}

grpc::ServerWriteReactor<loom::v1::RankControl>* AgentServiceImpl::Control(
    grpc::CallbackServerContext* context, const loom::v1::ControlRequest* /*request*/) {
  if (control_ == nullptr) {
    return RankControlHub::Refuse(
        grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "this agent has no control streams"));
  }
  const std::string_view token = BearerToken(*context);
  std::optional<RankIdentity> rank;
  if (!token.empty()) rank = tokens_->RankForToken(token);
  if (!rank) {
    return RankControlHub::Refuse(grpc::Status(
        grpc::StatusCode::PERMISSION_DENIED,
        "Control needs 'authorization: Bearer <rank token>' with the current token of a rank "
        "this agent runs"));
  }
  // A paused rank may still listen: nothing goes to the coordinator here.
  return control_->Attach(rank->launch_id);
}

absl::StatusOr<std::string> AgentSocketTarget(const std::string& work_dir) {
  const std::string path = absl::StrCat(work_dir, "/agent.sock");
  if (path.size() >= sizeof(sockaddr_un{}.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--work_dir='", work_dir, "' is too long: its agent.sock path has ", path.size(),
        " characters, and a Unix socket path may have at most ",
        sizeof(sockaddr_un{}.sun_path) - 1));
  }
  return absl::StrCat("unix:", path);
}

absl::StatusOr<std::unique_ptr<grpc::Server>> StartAgentServer(const std::string& target,
                                                               bool world_writable,
                                                               grpc::Service* service) {
  if (!absl::StartsWith(target, "unix:")) {
    return absl::InvalidArgumentError(absl::StrCat("agent socket '", target, "' must be unix:PATH"));
  }
  const std::string path = target.substr(5);
  struct stat st;
  if (lstat(path.c_str(), &st) == 0) {
    // A socket left by an agent that died; anything else is not ours to remove.
    if (!S_ISSOCK(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("'", path, "' exists and is not a socket; the agent will not remove it"));
    }
    if (unlink(path.c_str()) != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot remove the stale socket '", path, "': ", std::strerror(errno)));
    }
  }
  grpc::ServerBuilder builder;
  // What a rank may send in one message: a store value and its key, or one
  // progress report; anything bigger is refused by the transport before it
  // is read into memory.
  builder.SetMaxReceiveMessageSize(kMaxRankMessageBytes);
  builder.AddListeningPort(target, grpc::experimental::LocalServerCredentials(UDS));
  builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot listen on '", target, "'"));
  }
  if (chmod(path.c_str(), world_writable ? 0666 : 0600) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot set the mode of '", path, "': ", std::strerror(errno)));
  }
  return server;
}

}  // namespace loom::agent
