#include "worker/trainer/agent_control.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "grpcpp/security/credentials.h"

namespace loom::trainer {

AgentControlStream::AgentControlStream(const std::string& agent, std::string rank_token,
                                       ControlMailbox* mailbox,
                                       std::function<void(const std::string&)> on_event)
    // Local credentials: the agent's socket is on this host; the token says
    // which rank is calling.
    : stub_(loom::v1::AgentService::NewStub(
          grpc::CreateChannel(agent, grpc::experimental::LocalCredentials(UDS)))),
      mailbox_(mailbox),
      on_event_(std::move(on_event)),
      token_(std::move(rank_token)) {
  thread_ = std::thread([this] { Run(); });
}

AgentControlStream::~AgentControlStream() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (current_ != nullptr) current_->TryCancel();
  }
  thread_.join();
}

void AgentControlStream::set_rank_token(std::string token) {
  absl::MutexLock lock(&mu_);
  token_ = std::move(token);
}

void AgentControlStream::Run() {
  absl::Duration backoff = absl::Milliseconds(100);
  std::string last_error;
  while (true) {
    grpc::ClientContext context;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      context.AddMetadata("authorization", "Bearer " + token_);
      current_ = &context;
    }
    std::unique_ptr<grpc::ClientReader<loom::v1::RankControl>> reader =
        stub_->Control(&context, loom::v1::ControlRequest());
    loom::v1::RankControl message;
    while (reader->Read(&message)) {
      backoff = absl::Milliseconds(100);
      mailbox_->Post(message);
    }
    const grpc::Status status = reader->Finish();
    absl::MutexLock lock(&mu_);
    current_ = nullptr;
    if (stopping_) return;
    if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
      if (on_event_) {
        on_event_(
            "the agent serves no control channel: this rank leaves a failed attempt only "
            "when one of its own collectives fails");
      }
      return;
    }
    const std::string error =
        absl::StrCat(static_cast<int>(status.error_code()), " ", status.error_message());
    if (on_event_ && error != last_error) {
      on_event_(absl::StrCat("control stream to the agent ended (", error, "); reconnecting"));
      last_error = error;
    }
    // The wait ends early when the stream is being stopped.
    auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
    if (mu_.AwaitWithTimeout(absl::Condition(&stopping), backoff)) return;
    backoff = std::min(backoff * 2, absl::Seconds(5));
  }
}

}  // namespace loom::trainer
