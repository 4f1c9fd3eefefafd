#include "worker/agent/node_session.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/liveness/udp_socket.h"
#include "common/rpc/rpc_settings.h"

namespace loom::agent {

// Longer than keepalive needs to notice a dead connection (time + timeout).
constexpr absl::Duration kResendWindow = absl::Seconds(60);

NodeSession::NodeSession(NodeSessionOptions options, RankCommands* ranks)
    : options_(std::move(options)), ranks_(ranks), heartbeat_interval_(options_.default_heartbeat) {
  if (options_.read_log) {
    log_reads_ = std::make_unique<LogReadQueue>(options_.read_log, [this](loom::v1::RankLogChunk chunk) {
      loom::v1::NodeMessage message;
      *message.mutable_log_chunk() = std::move(chunk);
      Send(std::move(message));
    });
  }
}

NodeSession::~NodeSession() {
  Shutdown(absl::ZeroDuration());
  log_reads_.reset();  // before the members its replies use
}

void NodeSession::Send(loom::v1::NodeMessage message) {
  std::lock_guard lock(mu_);
  outbox_.push_back(std::move(message));
  cv_.notify_all();
}

int64_t NodeSession::streams_opened() const {
  std::lock_guard lock(mu_);
  return streams_opened_;
}

int64_t NodeSession::registrations() const {
  std::lock_guard lock(mu_);
  return registrations_;
}

void NodeSession::ReportExit(loom::v1::RankExited exited) {
  loom::v1::NodeMessage message;
  *message.mutable_rank_exited() = std::move(exited);
  std::lock_guard lock(mu_);
  // A rank's last reports go before its exit: the coordinator takes no
  // progress from a job that ended.
  while (!pending_progress_.empty()) outbox_.push_back(TakeProgressBatchLocked());
  outbox_.push_back(std::move(message));
  cv_.notify_all();
}

loom::v1::NodeMessage NodeSession::TakeProgressBatchLocked() {
  loom::v1::NodeMessage batch;
  auto& reports = *batch.mutable_progress()->mutable_reports();
  int64_t bytes = 0;
  while (!pending_progress_.empty() && reports.size() < kMaxProgressBatch) {
    const int64_t size = pending_progress_sizes_.front();
    if (!reports.empty() && bytes + size > rpc::kMaxProgressBatchBytes) break;
    bytes += size;
    pending_progress_bytes_ -= size;
    pending_progress_sizes_.pop_front();
    *reports.Add() = std::move(pending_progress_.front());
    pending_progress_.pop_front();
  }
  return batch;
}

void NodeSession::ReportProgress(loom::v1::RankProgress progress) {
  // The agent's socket refuses a bigger report (agent_service.cc); this keeps
  // the batch bound true whoever calls.
  const int64_t size = static_cast<int64_t>(progress.ByteSizeLong());
  std::lock_guard lock(mu_);
  if (size > rpc::kMaxProgressReportBytes) {
    ++progress_dropped_;
    return;
  }
  if (pending_progress_.empty()) {
    progress_due_ = Clock::now() + absl::ToChronoNanoseconds(options_.progress_batch_window);
  }
  pending_progress_.push_back(std::move(progress));
  pending_progress_sizes_.push_back(size);
  pending_progress_bytes_ += size;
  while (pending_progress_.size() > options_.max_pending_progress ||
         pending_progress_bytes_ > options_.max_pending_progress_bytes) {
    pending_progress_bytes_ -= pending_progress_sizes_.front();
    pending_progress_sizes_.pop_front();
    pending_progress_.pop_front();
    if (progress_dropped_++ == 0) {
      fprintf(stderr,
              "loom-worker: more than %zu progress reports wait for the coordinator; dropping "
              "the oldest\n",
              options_.max_pending_progress);
    }
  }
  cv_.notify_all();
}

int64_t NodeSession::progress_dropped() const {
  std::lock_guard lock(mu_);
  return progress_dropped_;
}

void NodeSession::Shutdown(absl::Duration flush_timeout) {
  std::unique_lock lock(mu_);
  stopping_ = true;
  cv_.notify_all();
  if (!running_) return;
  if (!cv_.wait_for(lock, absl::ToChronoNanoseconds(flush_timeout), [&] { return !running_; })) {
    if (context_ != nullptr) context_->TryCancel();
    cv_.wait(lock, [&] { return !running_; });
  }
}

void NodeSession::Run() {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    running_ = true;
  }
  // No credentials is a programming error, never a silent plaintext channel.
  if (options_.credentials == nullptr && options_.coordinators == nullptr) {
    std::fprintf(stderr, "loom-worker: NodeSessionOptions.credentials is required\n");
    std::abort();
  }
  std::shared_ptr<rpc::CoordinatorChannel> shared = options_.coordinators;
  if (shared == nullptr) {
    shared = std::make_shared<rpc::CoordinatorChannel>(options_.coordinator, options_.credentials);
  }
  rpc::CoordinatorChannel& coordinators = *shared;
  absl::Duration backoff = options_.initial_backoff;
  int failures_in_a_row = 0;
  std::unique_lock lock(mu_);
  while (!stopping_) {
    lock.unlock();
    const bool registered = RunStream(coordinators);
    lock.lock();
    if (stopping_) break;
    if (registered) {
      backoff = options_.initial_backoff;
      failures_in_a_row = 0;
    }
    // One line per outage rather than one per attempt.
    if (failures_in_a_row++ == 0) {
      fprintf(stderr,
              "loom-worker: no session with coordinator %s (%s); retrying with backoff up to %s, "
              "ranks keep running\n",
              options_.coordinator.c_str(), last_error_.c_str(),
              absl::FormatDuration(options_.max_backoff).c_str());
    }
    cv_.wait_for(lock, absl::ToChronoNanoseconds(backoff), [&] { return stopping_; });
    // With several coordinators a standby takes over within its lease: look
    // for the new leader often.
    backoff = std::min(backoff * 2, coordinators.several()
                                        ? std::min(options_.max_backoff, absl::Seconds(1))
                                        : options_.max_backoff);
  }
  running_ = false;
  cv_.notify_all();
}

void NodeSession::Drain(const std::string& reason) {
  loom::v1::NodeMessage message;
  message.mutable_draining()->set_reason(reason);
  Send(std::move(message));
}

void NodeSession::OnRegistered(const loom::v1::Registered& registered) {
  std::lock_guard lock(mu_);
  registered_ = true;
  ++registrations_;
  int64_t ms = registered.heartbeat_interval_ms();
  heartbeat_interval_ = ms > 0 ? absl::Milliseconds(ms) : options_.default_heartbeat;
  next_heartbeat_ = Clock::now() + absl::ToChronoNanoseconds(heartbeat_interval_);
  // The coordinator read the registration: the lease runs from when it
  // was sent (Lease has its own lock; it never calls back).
  if (options_.lease != nullptr) {
    options_.lease->Registered(registered.lease_ms(), register_sent_);
  }
  cv_.notify_all();
  fprintf(stderr,
          "loom-worker: registered with coordinator %s as %s (heartbeat %s, lease %s)\n",
          address_.c_str(), registered.node_id().c_str(),
          absl::FormatDuration(heartbeat_interval_).c_str(),
          registered.lease_ms() > 0
              ? absl::FormatDuration(absl::Milliseconds(registered.lease_ms())).c_str()
              : "none");
}

void NodeSession::Dispatch(const loom::v1::CoordinatorMessage& message) {
  switch (message.kind_case()) {
    case loom::v1::CoordinatorMessage::kRegistered: {
      OnRegistered(message.registered());
      // It resolves the coordinator's host: not under mu_.
      StartBeats(message.registered());
      return;
    }
    case loom::v1::CoordinatorMessage::kHeartbeatAck:
      if (options_.lease != nullptr) options_.lease->Acked(message.heartbeat_ack().seq());
      return;
    case loom::v1::CoordinatorMessage::kLaunch:
      (void)ranks_->Launch(message.launch().assignment());  // failures come back as exits
      return;
    case loom::v1::CoordinatorMessage::kKill:
      ranks_->Kill(message.kill());
      return;
    case loom::v1::CoordinatorMessage::kAbort:
      ranks_->Abort(message.abort());
      return;
    case loom::v1::CoordinatorMessage::kEnterEpoch:
      ranks_->EnterEpoch(message.enter_epoch());
      return;
    case loom::v1::CoordinatorMessage::kTrace:
      ranks_->Trace(message.trace());
      return;
    case loom::v1::CoordinatorMessage::kResume:
      ranks_->Resume(message.resume());
      return;
    case loom::v1::CoordinatorMessage::kStop:
      ranks_->Stop(message.stop());
      return;
    case loom::v1::CoordinatorMessage::kReadLog:
      if (log_reads_ != nullptr) {
        log_reads_->Submit(message.read_log());
      } else {
        loom::v1::NodeMessage answer;
        answer.mutable_log_chunk()->set_request_id(message.read_log().request_id());
        answer.mutable_log_chunk()->set_error_code(12);  // UNIMPLEMENTED
        answer.mutable_log_chunk()->set_error("this agent does not serve logs");
        Send(std::move(answer));
      }
      return;
    case loom::v1::CoordinatorMessage::KIND_NOT_SET:
      return;  // a newer coordinator's message this agent does not know
  }
}

void NodeSession::StartBeats(const loom::v1::Registered& registered) {
  std::unique_ptr<LivenessBeater> earlier;
  std::string address;
  absl::Duration interval;
  {
    std::lock_guard lock(mu_);
    earlier = std::move(beater_);
    address = address_;
    interval = heartbeat_interval_;
  }
  earlier.reset();
  const loom::v1::LivenessGrant& grant = registered.liveness();
  if (!registered.has_liveness() || grant.port() == 0 || grant.port() > 65535 ||
      grant.key().size() != liveness::kKeyBytes) {
    return;  // a coordinator without the path: the session's heartbeats alone
  }
  absl::StatusOr<std::string> host = liveness::HostOf(address);
  absl::StatusOr<std::unique_ptr<LivenessBeater>> beater =
      host.ok() ? LivenessBeater::Start({.host = *host,
                                         .port = static_cast<int>(grant.port()),
                                         .node_id = options_.registration.node_id(),
                                         .grant = {grant.session(), grant.key()},
                                         .interval = interval,
                                         .lease = options_.lease,
                                         .seq = &heartbeat_seq_})
                : absl::StatusOr<std::unique_ptr<LivenessBeater>>(host.status());
  if (!beater.ok()) {
    fprintf(stderr, "loom-worker: no liveness beats (%s); heartbeats on the session only\n",
            std::string(beater.status().message()).c_str());
    return;
  }
  fprintf(stderr, "loom-worker: liveness beats to UDP %s:%u\n", host->c_str(), grant.port());
  std::lock_guard lock(mu_);
  beater_ = *std::move(beater);
}

void NodeSession::AwaitChannelWhileLeased(grpc::Channel& channel) {
  if (options_.lease == nullptr) return;
  while (true) {
    {
      std::lock_guard lock(mu_);
      if (stopping_) return;
    }
    if (options_.lease->lease_ms() <= 0 || options_.lease->Observe().expired) return;
    if (channel.WaitForConnected(absl::ToChronoTime(absl::Now() + kLeaseReconnectPoll))) return;
    grpc::experimental::ChannelResetConnectionBackoff(&channel);
  }
}

bool NodeSession::RunStream(rpc::CoordinatorChannel& coordinators) {
  if (coordinators.several() && !coordinators.FindLeader()) {
    std::lock_guard lock(mu_);
    last_error_ = "none of the coordinators leads right now";
    return false;
  }
  // (FindLeader has just reached the leader when there are several.)
  if (!coordinators.several()) AwaitChannelWhileLeased(*coordinators.channel());
  auto stub = loom::v1::NodeService::NewStub(coordinators.channel());
  grpc::ClientContext context;
  int64_t registrations_before = 0;
  {
    std::lock_guard lock(mu_);
    address_ = coordinators.address();
    if (stopping_) return false;
    context_ = &context;
    registered_ = false;
    broken_ = false;
    ++streams_opened_;
    registrations_before = registrations_;
  }
  // Wait for the channel instead of failing fast: a restarted coordinator is
  // then reached as soon as the channel reconnects (its backoff is at most 2 s),
  // not at the next step of this loop's longer backoff.
  // (With several coordinators FindLeader just reached the leader: fail
  // fast instead, so a leader that dies now is not waited for.)
  context.set_wait_for_ready(!coordinators.several());
  auto stream = stub->Session(&context);

  loom::v1::NodeMessage hello;
  *hello.mutable_register_() = options_.registration;
  for (auto& rank : ranks_->Running()) *hello.mutable_register_()->add_running() = std::move(rank);
  {
    // Before the write: a lease counted from earlier is only shorter.
    std::lock_guard lock(mu_);
    register_sent_ = Clock::now();
  }
  bool ok = stream->Write(hello);

  std::thread reader([&] {
    loom::v1::CoordinatorMessage message;
    while (stream->Read(&message)) Dispatch(message);
    std::lock_guard lock(mu_);
    broken_ = true;
    cv_.notify_all();
  });

  // Exits written on this stream. A write that succeeded only reached the
  // local buffers: if the stream then fails, the coordinator may never have
  // read it, so recent ones are sent again on the next stream.
  std::deque<std::pair<Clock::time_point, loom::v1::NodeMessage>> sent;
  std::unique_lock lock(mu_);
  while (ok && !broken_) {
    // A batch goes when its oldest report has waited the window (or at once
    // when stopping, or when it is full).
    auto progress_due = [&] {
      return !pending_progress_.empty() &&
             (stopping_ || Clock::now() >= progress_due_ ||
              pending_progress_.size() >= static_cast<size_t>(kMaxProgressBatch) ||
              pending_progress_bytes_ >= rpc::kMaxProgressBatchBytes);
    };
    auto wake = [&] {
      return broken_ || stopping_ ||
             (registered_ &&
              (!outbox_.empty() || progress_due() || Clock::now() >= next_heartbeat_));
    };
    if (registered_) {
      Clock::time_point until = next_heartbeat_;
      if (!pending_progress_.empty()) until = std::min(until, progress_due_);
      cv_.wait_until(lock, until, wake);
    } else {
      cv_.wait(lock, [&] { return broken_ || stopping_ || registered_; });
    }
    if (broken_) break;
    if (registered_ && !outbox_.empty()) {
      loom::v1::NodeMessage message = std::move(outbox_.front());
      outbox_.pop_front();
      lock.unlock();
      ok = stream->Write(message);
      lock.lock();
      if (message.has_log_chunk()) {
        // Not kept or resent: the request it answers died with its stream.
      } else if (ok) {
        const Clock::time_point now = Clock::now();
        sent.emplace_back(now, std::move(message));
        while (sent.front().first < now - absl::ToChronoNanoseconds(kResendWindow)) {
          sent.pop_front();
        }
      } else {
        outbox_.push_front(std::move(message));  // sent again on the next stream
      }
      continue;
    }
    if (registered_ && progress_due()) {
      // Into the outbox, so a batch is written, kept for resending and
      // re-queued on failure like every other message.
      outbox_.push_back(TakeProgressBatchLocked());
      // What a full batch left behind has waited already: it goes next.
      if (!pending_progress_.empty()) progress_due_ = Clock::now();
      continue;
    }
    if (stopping_) break;
    if (registered_ && Clock::now() >= next_heartbeat_) {
      next_heartbeat_ = Clock::now() + absl::ToChronoNanoseconds(heartbeat_interval_);
      loom::v1::NodeMessage beat;
      beat.mutable_heartbeat()->set_seq(++heartbeat_seq_);
      lock.unlock();
      for (auto& rank : ranks_->Running()) {
        *beat.mutable_heartbeat()->add_running() = std::move(rank);
      }
      // Lets the coordinator tell its own backlog from this node's silence.
      const Clock::time_point sent = Clock::now();
      beat.mutable_heartbeat()->set_sent_monotonic_us(
          std::chrono::duration_cast<std::chrono::microseconds>(sent.time_since_epoch()).count());
      // Noted before the write, so its ack always finds it.
      if (options_.lease != nullptr) options_.lease->HeartbeatSent(beat.heartbeat().seq(), sent);
      ok = stream->Write(beat);
      lock.lock();
    }
  }
  if (ok && !broken_ && stopping_) {
    // A clean goodbye: the coordinator sees end-of-stream and finishes the
    // call; Shutdown cancels it if that does not happen in time.
    lock.unlock();
    stream->WritesDone();
    lock.lock();
    cv_.wait(lock, [&] { return broken_; });
  }
  lock.unlock();
  context.TryCancel();
  reader.join();
  lock.lock();
  std::unique_ptr<LivenessBeater> beater = std::move(beater_);  // the grant was this stream's
  lock.unlock();
  beater.reset();
  grpc::Status status = stream->Finish();
  coordinators.Failed(status, &context);
  lock.lock();
  context_ = nullptr;
  if (!stopping_) {
    const Clock::time_point since = Clock::now() - absl::ToChronoNanoseconds(kResendWindow);
    for (auto it = sent.rbegin(); it != sent.rend(); ++it) {
      if (it->first >= since) outbox_.push_front(std::move(it->second));
    }
  }
  last_error_ = status.ok() ? std::string("the coordinator ended the session")
                            : absl::StrCat(status.error_message(), " [code ",
                                           static_cast<int>(status.error_code()), "]");
  return registrations_ > registrations_before;
}

}  // namespace loom::agent
