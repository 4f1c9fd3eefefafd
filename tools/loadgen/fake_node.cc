#include "tools/loadgen/fake_node.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace loom::loadgen {
namespace {

using loom::v1::NodeMessage;
using Phase = RankLife::Phase;

constexpr int kMaxErrorsLogged = 10;
std::atomic<int> errors_logged{0};

void LogError(const std::string& what) {
  if (errors_logged.fetch_add(1) < kMaxErrorsLogged) {
    std::fprintf(stderr, "loom-loadgen: %s\n", what.c_str());
  }
}

int64_t MonotonicMicros(agent::Lease::TimePoint t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

}  // namespace

FakeNode::FakeNode(std::string id, int gpus, std::shared_ptr<grpc::Channel> channel,
                   NodeShared* shared)
    : id_(std::move(id)),
      gpus_(gpus),
      node_stub_(loom::v1::NodeService::NewStub(channel)),
      rank_stub_(loom::v1::RankService::NewStub(channel)),
      shared_(shared),
      gets_(rank_stub_.get(), shared->stats, &shared->shutting_down),
      writes_(rank_stub_.get(), shared->stats, &shared->shutting_down) {}

void FakeNode::Start() {
  node_stub_->async()->Session(&context_, this);
  AddHold();
  StartRead(&in_);
  NodeMessage message;
  loom::v1::RegisterNode* r = message.mutable_register_();
  r->set_node_id(id_);
  r->set_hostname(id_);
  r->set_address("127.0.0.1");
  loom::v1::Device* d = r->add_devices();
  d->set_kind("gpu");
  d->set_count(gpus_);
  d->set_name("NVIDIA H200");
  d->set_memory_bytes(int64_t{143771} << 20);
  d->set_peak_flops(989e12);
  {
    std::lock_guard<std::mutex> lock(mu_);
    register_sent_ = agent::Lease::Clock::now();  // the lease runs from here
  }
  Send(std::move(message));
  StartCall();
}

bool FakeNode::registered() const {
  std::lock_guard<std::mutex> lock(mu_);
  return registered_;
}

bool FakeNode::PausedLocked(const RankLife& rank) const {
  return rank.lease_generation() != lease_.generation();
}

NodeMessage FakeNode::ExitMessage(const RankLife& rank, int32_t attempt, int exit_code, int signal,
                                  const std::string& why) {
  NodeMessage message;
  loom::v1::RankExited* e = message.mutable_rank_exited();
  e->set_job_id(rank.job_id());
  e->set_attempt(attempt);
  e->set_rank(rank.rank());
  e->set_exit_code(exit_code);
  e->set_signal(signal);
  e->set_log_tail(why);
  e->set_exited_unix_us(absl::ToUnixMicros(absl::Now()));  // as the agent saw it end
  return message;
}

void FakeNode::Heartbeat() {
  bool write_now = false;
  NodeMessage spare;
  std::vector<NodeMessage> exits;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!registered_ || ended_ || lost_) return;
    const agent::Lease::TimePoint steady = agent::Lease::Clock::now();
    if (const agent::Lease::State lease = lease_.Observe(steady);
        lease.expired && lease.generation > expiries_seen_) {
      expiries_seen_ = lease.generation;
      int paused = 0;
      for (const auto& rank : ranks_) {
        if (rank->alive() && rank->lease_generation() < lease.generation) ++paused;
      }
      shared_->stats->lease_expiries++;
      shared_->stats->ranks_paused += paused;
      LogError(absl::StrCat("node ", id_, ": its lease ran out (no heartbeat acknowledged within ",
                            lease_.lease_ms(), " ms): ", paused, " ranks paused"));
    }
    // An aborted rank that no EnterEpoch reached within its collective
    // timeout gives up, as loom-trainer does (exit 4).
    const absl::Time now = absl::Now();
    for (const auto& rank : ranks_) {
      if (rank->alive() && rank->phase() == Phase::kAborted && !rank->silent() &&
          now - rank->aborted_since() > absl::Seconds(rank->collective_timeout_s())) {
        exits.push_back(ExitMessage(*rank, rank->attempt(), 4, 0,
                                    absl::StrCat("attempt ", rank->attempt(),
                                                 ": no EnterEpoch within the collective timeout")));
        rank->Exit();
        shared_->stats->ranks_gave_up++;
      }
    }
    NodeMessage* beat = heartbeat_busy_ ? &spare : &heartbeat_;
    loom::v1::Heartbeat* h = beat->mutable_heartbeat();
    h->set_seq(++seq_);
    // As loom-worker does: the coordinator measures how late it reads
    // heartbeats from this (this includes loadgen's own queueing).
    h->set_sent_monotonic_us(MonotonicMicros(steady));
    lease_.HeartbeatSent(seq_, steady);
    unacked_.emplace_back(seq_, now);
    if (unacked_.size() > 64) unacked_.pop_front();
    h->mutable_running()->Clear();  // keeps the entries for reuse
    const uint64_t generation = lease_.generation();
    for (const auto& rank : ranks_) {
      if (!rank->alive()) continue;
      loom::v1::RunningRank* r = h->mutable_running()->Add();
      r->set_job_id(rank->job_id());
      r->set_attempt(rank->attempt());
      r->set_rank(rank->rank());
      r->set_pid(rank->pid());
      r->set_paused(rank->lease_generation() != generation);
    }
    if (beat == &spare) {
      outbox_.emplace_back(std::move(spare), now);  // a write is in flight
    } else {
      heartbeat_busy_ = true;
      heartbeat_queued_at_ = now;
      if (writing_) {
        heartbeat_queued_ = true;
      } else {
        writing_ = true;
        in_flight_ = &heartbeat_;
        write_now = true;
      }
    }
  }
  if (write_now) StartWrite(&heartbeat_);
  for (NodeMessage& exit : exits) Send(std::move(exit));
}

bool FakeNode::EventsPending(bool first_step_due) const {
  return events_pending_.load(std::memory_order_relaxed) ||
         (first_step_due && awaiting_first_step_.load(std::memory_order_relaxed));
}

void FakeNode::SendBatch(bool full, absl::Time now, const JobClock::View& clock) {
  bool write_now = false;
  std::vector<RankLife*> begin;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!registered_ || ended_ || lost_) return;
    for (auto it = to_start_.begin(); it != to_start_.end();) {
      if (now >= it->second) {
        begin.push_back(it->first);
        it = to_start_.erase(it);
      } else {
        ++it;
      }
    }
    const uint64_t generation = lease_.generation();
    auto sends = [&](const RankLife& rank) {
      return rank.alive() && !rank.silent() && rank.lease_generation() == generation;
    };
    if (batch_busy_) {
      // Events stay pending for the next tick; a full batch is skipped.
      if (full) {
        int64_t skipped = 0;
        for (const auto& rank : ranks_) {
          if (sends(*rank) && (rank->running() || rank->phase() == Phase::kJoined)) ++skipped;
        }
        if (skipped > 0) {
          shared_->stats->reports_skipped += skipped;
          shared_->stats->batches_skipped++;
        }
      }
    } else {
      events_pending_ = false;  // what is pending now goes in this batch
      const int64_t now_us = absl::ToUnixMicros(now);
      auto* reports = batch_.mutable_progress()->mutable_reports();
      reports->Clear();  // keeps the messages for reuse
      batch_ready_ = 0;
      bool awaiting = false;
      for (const auto& rank : ranks_) {
        if (!sends(*rank)) continue;
        const int before = reports->size();
        switch (rank->phase()) {
          case Phase::kJoined:
            rank->FillReady(reports->Add(), now_us);
            rank->FillResumed(reports->Add(), now_us);
            shared_->clock->Resumed(rank->attempt(), rank->rank(), now);
            ++batch_ready_;
            break;
          case Phase::kAborted:
            if (rank->abort_pending()) {
              rank->FillAborted(reports->Add(), now_us);
              shared_->stats->ranks_aborted++;
            }
            break;
          case Phase::kRunning:
            if (full || (!rank->past_first_step() && rank->HasNewStep(clock))) {
              if (rank->FillStep(reports->Add(), clock, now_us)) {
                shared_->clock->PastFirstStep(rank->attempt(), rank->rank(), now);
              }
            }
            break;
          default:
            break;
        }
        if (rank->running() && !rank->past_first_step()) awaiting = true;
        if (rank->attempt() < newest_attempt_) {
          shared_->stats->stale_reports += reports->size() - before;
        }
      }
      awaiting_first_step_ = awaiting;
      if (!reports->empty()) {
        batch_busy_ = true;
        if (writing_) {
          batch_queued_ = true;
        } else {
          writing_ = true;
          in_flight_ = &batch_;
          write_now = true;
        }
      }
    }
  }
  if (write_now) StartWrite(&batch_);
  for (RankLife* rank : begin) BeginRendezvous(rank);
}

bool FakeNode::Runs(int rank) const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::any_of(ranks_.begin(), ranks_.end(),
                     [rank](const auto& r) { return r->alive() && r->rank() == rank; });
}

std::vector<int32_t> FakeNode::LiveRanks() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int32_t> live;
  for (const auto& r : ranks_) {
    if (r->alive()) live.push_back(r->rank());
  }
  return live;
}

bool FakeNode::CrashRank(int rank) {
  NodeMessage exit;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (lost_) return false;
    auto it = std::find_if(ranks_.begin(), ranks_.end(),
                           [rank](const auto& r) { return r->alive() && r->rank() == rank; });
    if (it == ranks_.end()) return false;
    exit = ExitMessage(**it, (*it)->attempt(), 0, 9, "killed by loom-loadgen (SIGKILL)");
    (*it)->Exit();
  }
  Send(std::move(exit));
  CancelAbandonedGets();
  return true;
}

bool FakeNode::SilenceRank(int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& r : ranks_) {
    if (r->alive() && r->rank() == rank) {
      r->set_silent();
      return true;
    }
  }
  return false;
}

void FakeNode::Lose() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    lost_ = true;
    for (const auto& rank : ranks_) rank->Exit();
  }
  gets_.CancelExcept(nullptr);
  writes_.CancelAll();
  context_.TryCancel();
}

int FakeNode::RanksBehind(const std::string& job_id, int32_t attempt) const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(std::count_if(ranks_.begin(), ranks_.end(), [&](const auto& r) {
    return r->alive() && !r->silent() && r->job_id() == job_id && r->attempt() < attempt;
  }));
}

void FakeNode::Cancel() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& rank : ranks_) rank->Exit();
  }
  gets_.CancelExcept(nullptr);
  writes_.CancelAll();
  context_.TryCancel();
}

void FakeNode::OnReadDone(bool ok) {
  if (!ok) {
    bool lost = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ended_ = true;
      lost = lost_;
    }
    if (!shared_->shutting_down.load() && !lost) {
      shared_->stats->sessions_ended++;
      LogError(absl::StrCat("node ", id_, ": session ended"));
    }
    ReleaseHold();
    return;
  }
  ClusterStats* stats = shared_->stats;
  switch (in_.kind_case()) {
    case loom::v1::CoordinatorMessage::kRegistered: {
      stats->registered++;
      agent::Lease::TimePoint sent;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!registered_) stats->sessions_registered++;
        registered_ = true;
        sent = register_sent_;
      }
      lease_.Registered(in_.registered().lease_ms(), sent);
      break;
    }
    case loom::v1::CoordinatorMessage::kHeartbeatAck: {
      stats->heartbeat_acks++;
      const int64_t seq = in_.heartbeat_ack().seq();
      lease_.Acked(seq);
      std::lock_guard<std::mutex> lock(mu_);
      while (!unacked_.empty() && unacked_.front().first < seq) unacked_.pop_front();
      if (!unacked_.empty() && unacked_.front().first == seq) {
        stats->ack_delay.Record(absl::Now() - unacked_.front().second);
        unacked_.pop_front();
      }
      break;
    }
    case loom::v1::CoordinatorMessage::kLaunch:
      stats->launches++;
      Launch(in_.launch().assignment());
      break;
    case loom::v1::CoordinatorMessage::kKill:
      stats->kills++;
      Kill(in_.kill());
      break;
    case loom::v1::CoordinatorMessage::kAbort:
      stats->aborts++;
      Abort(in_.abort());
      break;
    case loom::v1::CoordinatorMessage::kEnterEpoch:
      stats->enter_epochs++;
      EnterEpoch(in_.enter_epoch());
      break;
    case loom::v1::CoordinatorMessage::kResume:
      stats->resumes++;
      Resume(in_.resume());
      break;
    default:
      break;
  }
  StartRead(&in_);
}

void FakeNode::Launch(const loom::v1::RankAssignment& assignment) {
  const absl::Time now = absl::Now();
  RankLife* begin = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (lost_) return;
    for (const auto& r : ranks_) {
      // A launch of a rank still running is ignored, as loom-worker does.
      if (r->alive() && r->job_id() == assignment.job_id() &&
          r->attempt() == assignment.attempt() && r->rank() == assignment.rank()) {
        return;
      }
    }
    auto rank = std::make_unique<RankLife>(assignment);
    rank->set_pid(shared_->next_pid++);
    rank->set_lease_generation(lease_.generation());
    newest_attempt_ = std::max(newest_attempt_, assignment.attempt());
    shared_->clock->BeginAttempt(assignment.attempt(), rank->base_step(), rank->world_size(), now);
    begin = rank.get();
    ranks_.push_back(std::move(rank));
    if (const double spread = shared_->rank_start_spread_s; spread > 0) {
      to_start_.emplace_back(begin, now + absl::Seconds(spread * uniform_(random_)));
      begin = nullptr;
    }
  }
  if (begin != nullptr) BeginRendezvous(begin);
}

void FakeNode::Kill(const loom::v1::KillRanks& kill) {
  std::vector<NodeMessage> exits;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& r : ranks_) {
      if (!r->alive() || r->job_id() != kill.job_id()) continue;
      if (kill.attempt() != 0 && kill.attempt() != r->attempt()) continue;
      if (!kill.ranks().empty() &&
          std::find(kill.ranks().begin(), kill.ranks().end(), r->rank()) == kill.ranks().end()) {
        continue;
      }
      // A stopped process cannot handle SIGTERM: the agent SIGKILLs it.
      const bool stopped = PausedLocked(*r) || r->silent();
      exits.push_back(ExitMessage(*r, r->attempt(), 0, stopped ? 9 : 15, ""));
      r->Exit();
    }
  }
  for (NodeMessage& exit : exits) Send(std::move(exit));
  if (!exits.empty()) CancelAbandonedGets();
}

void FakeNode::Abort(const loom::v1::AbortRanks& abort) {
  const absl::Time now = absl::Now();
  const JobClock::View clock = shared_->clock->At(now);
  bool any = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& r : ranks_) {
      // A stopped process hears nothing (the coordinator kills it).
      if (r->job_id() != abort.job_id() || r->silent()) continue;
      const int64_t completed = clock.attempt == r->attempt() ? clock.step : r->base_step();
      if (r->Abort(abort.attempt(), completed)) {
        r->set_aborted_since(now);
        any = true;
      }
    }
  }
  if (any) {
    events_pending_ = true;
    CancelAbandonedGets();  // ranks that left their rendezvous
  }
}

void FakeNode::EnterEpoch(const loom::v1::EnterEpoch& epoch) {
  const absl::Time now = absl::Now();
  std::vector<NodeMessage> exits;
  std::vector<RankLife*> begin;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (lost_) return;
    for (const loom::v1::RankEpoch& entry : epoch.ranks()) {
      RankLife* rank = nullptr;
      bool repeated = false;
      for (const auto& r : ranks_) {
        if (!r->alive() || r->silent() || r->job_id() != epoch.job_id() ||
            r->rank() != entry.rank()) {
          continue;
        }
        if (r->attempt() == epoch.from_attempt()) rank = r.get();
        if (r->attempt() == epoch.attempt() && r->rank_token() == entry.rank_token()) {
          repeated = true;
        }
      }
      if (rank == nullptr) {
        if (!repeated) {
          shared_->stats->epoch_entries_skipped++;
          LogError(absl::StrCat("node ", id_, ": EnterEpoch to attempt ", epoch.attempt(),
                                " names rank ", entry.rank(),
                                ", which does not run here in attempt ", epoch.from_attempt()));
        }
        continue;
      }
      std::vector<int32_t> not_held;
      const absl::Status entered = rank->Enter(epoch, entry, &not_held);
      if (!not_held.empty()) {
        shared_->stats->restore_copies_missing += static_cast<int64_t>(not_held.size());
        LogError(absl::StrCat("node ", id_, ": rank ", entry.rank(), " is to send ",
                              not_held.size(), " relaunched ranks their snapshot of step ",
                              epoch.restore_step(), " but holds no copy of it for them"));
      }
      if (!entered.ok()) {
        // The agent moved it to the new attempt; the trainer cannot restore
        // and exits 1 (a crash: the coordinator falls back to the whole job).
        shared_->stats->restore_failures++;
        LogError(absl::StrCat("node ", id_, ": ", entered.message()));
        exits.push_back(ExitMessage(*rank, epoch.attempt(), 1, 0, std::string(entered.message())));
        rank->Exit();
        continue;
      }
      shared_->stats->ranks_entered++;
      shared_->clock->BeginAttempt(epoch.attempt(), epoch.restore_step(), rank->world_size(), now);
      begin.push_back(rank);
    }
    newest_attempt_ = std::max(newest_attempt_, epoch.attempt());
  }
  for (NodeMessage& exit : exits) Send(std::move(exit));
  for (RankLife* rank : begin) BeginRendezvous(rank);
}

void FakeNode::Resume(const loom::v1::ResumeRanks& resume) {
  std::vector<RankLife*> begin;
  int resumed = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t generation = lease_.generation();
    for (const loom::v1::RunningRank& named : resume.ranks()) {
      for (const auto& r : ranks_) {
        if (!r->alive() || r->job_id() != named.job_id() || r->attempt() != named.attempt() ||
            r->rank() != named.rank() || (named.pid() != 0 && named.pid() != r->pid()) ||
            r->lease_generation() == generation) {
          continue;
        }
        r->set_lease_generation(generation);
        ++resumed;
        if (r->phase() == Phase::kLaunched) begin.push_back(r.get());
      }
    }
  }
  shared_->stats->ranks_resumed += resumed;
  if (resumed > 0) events_pending_ = true;
  for (RankLife* rank : begin) BeginRendezvous(rank);
}

bool FakeNode::JoiningLocked(const RankLife* rank, int32_t attempt) const {
  return !lost_ && rank->alive() && rank->attempt() == attempt && rank->phase() == Phase::kJoining;
}

void FakeNode::BeginRendezvous(RankLife* rank) {
  loom::v1::StoreOp op;
  int32_t attempt = 0;
  bool carried = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // A paused rank begins once ResumeRanks continues it.
    if (lost_ || !rank->alive() || rank->phase() != Phase::kLaunched || rank->silent() ||
        PausedLocked(*rank)) {
      return;
    }
    attempt = rank->attempt();
    carried = rank->carried();
    if (carried) {
      rank->BeginCarried();
    } else {
      op = rank->Begin();
    }
  }
  // A survivor's address is in the new namespace already: only the barrier.
  if (carried) return WaitForGo(rank, attempt);
  writes_.Send(std::move(op), [this, rank, attempt](const grpc::Status& status, int64_t) {
    if (!status.ok()) return RendezvousFailed(rank, attempt, "StoreSet of its address", status);
    Join(rank, attempt);
  });
}

void FakeNode::Join(RankLife* rank, int32_t attempt) {
  loom::v1::StoreOp op;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!JoiningLocked(rank, attempt)) return;
    op = rank->JoinOp();
  }
  writes_.Send(std::move(op), [this, rank, attempt](const grpc::Status& status, int64_t joined) {
    if (!status.ok()) return RendezvousFailed(rank, attempt, "StoreAdd of the join count", status);
    if (rank->IsLastJoiner(joined)) {
      Release(rank, attempt);
    } else {
      WaitForGo(rank, attempt);
    }
  });
}

// The last rank to join opens the barrier.
void FakeNode::Release(RankLife* rank, int32_t attempt) {
  loom::v1::StoreOp op;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!JoiningLocked(rank, attempt)) return;
    op = rank->ReleaseOp();
  }
  writes_.Send(std::move(op), [this, rank, attempt](const grpc::Status& status, int64_t) {
    if (!status.ok()) return RendezvousFailed(rank, attempt, "StoreSet of go", status);
    PassedBarrier(rank, attempt);
  });
}

void FakeNode::WaitForGo(RankLife* rank, int32_t attempt) {
  std::string store_namespace;
  std::string token;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!JoiningLocked(rank, attempt)) return;
    store_namespace = rank->store_namespace();
    token = rank->rank_token();
  }
  gets_.Wait(store_namespace, RankLife::kGoKey, token,
             [this, rank, attempt](const grpc::Status& status) {
               if (!status.ok()) return RendezvousFailed(rank, attempt, "StoreGet of go", status);
               PassedBarrier(rank, attempt);
             });
}

void FakeNode::PassedBarrier(RankLife* rank, int32_t attempt) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!JoiningLocked(rank, attempt)) return;
    rank->PassedBarrier();
  }
  events_pending_ = true;  // its "ready" goes in the node's next batch
}

void FakeNode::RendezvousFailed(RankLife* rank, int32_t attempt, const std::string& what,
                                const grpc::Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // A rank that left the attempt (aborted, moved on, killed) lets it go.
    if (!JoiningLocked(rank, attempt)) return;
  }
  if (shared_->shutting_down.load()) return;
  shared_->stats->rendezvous_failed++;
  LogError(absl::StrCat("node ", id_, ": rank ", rank->rank(), " attempt ", attempt, ": ", what,
                        ": ", status.error_message()));
}

void FakeNode::CancelAbandonedGets() {
  std::set<std::string> keep;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& r : ranks_) {
      if (r->alive() && r->phase() == Phase::kJoining) keep.insert(r->store_namespace());
    }
  }
  gets_.CancelExcept(&keep);
}

void FakeNode::OnWriteDone(bool ok) {
  NodeMessage* next = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ClusterStats* stats = shared_->stats;
    if (in_flight_ == &batch_) {
      batch_busy_ = false;
      if (ok) {
        stats->reports_sent += batch_.progress().reports_size();
        stats->batches_sent++;
        stats->ranks_ready += batch_ready_;
      }
    } else if (in_flight_ == &heartbeat_) {
      heartbeat_busy_ = false;
      if (ok) {
        stats->heartbeats_sent++;
        stats->heartbeat_delay.Record(absl::Now() - heartbeat_queued_at_);
      }
    } else if (ok && out_.has_heartbeat()) {
      stats->heartbeats_sent++;
      stats->heartbeat_delay.Record(absl::Now() - out_queued_);
    } else if (ok && out_.has_rank_exited()) {
      stats->exits_sent++;
    }
    if (!ok) {
      ended_ = true;
      writing_ = false;
      in_flight_ = nullptr;
      outbox_.clear();
      heartbeat_queued_ = false;
      heartbeat_busy_ = false;
      batch_queued_ = false;
      batch_busy_ = false;
      return;
    }
    if (heartbeat_queued_) {
      heartbeat_queued_ = false;
      next = &heartbeat_;
    } else if (!outbox_.empty()) {
      out_ = std::move(outbox_.front().first);
      out_queued_ = outbox_.front().second;
      outbox_.pop_front();
      next = &out_;
    } else if (batch_queued_) {
      batch_queued_ = false;
      next = &batch_;
    }
    in_flight_ = next;
    writing_ = next != nullptr;
  }
  if (next != nullptr) StartWrite(next);
}

void FakeNode::OnDone(const grpc::Status& status) {
  std::lock_guard<std::mutex> lock(mu_);
  ended_ = true;
  if (!status.ok() && !lost_ && !shared_->shutting_down.load()) {
    LogError(absl::StrCat("node ", id_, ": session status: ", status.error_message()));
  }
}

void FakeNode::Send(NodeMessage message) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ended_ || lost_) return;
    if (writing_) {
      outbox_.emplace_back(std::move(message), absl::Now());
      return;
    }
    writing_ = true;
    out_ = std::move(message);
    out_queued_ = absl::Now();
    in_flight_ = &out_;
  }
  StartWrite(&out_);
}

void FakeNode::ReleaseHold() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (hold_released_) return;
    hold_released_ = true;
  }
  RemoveHold();
}

}  // namespace loom::loadgen
