#include "tools/loadgen/sched_node.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/spec/job_spec_yaml.h"

namespace loom::loadgen {

using loom::v1::NodeMessage;

SchedNode::SchedNode(std::string id, int gpus, std::map<std::string, std::string> labels,
                     std::shared_ptr<grpc::Channel> channel, SchedShared* shared)
    : id_(std::move(id)),
      gpus_(gpus),
      labels_(std::move(labels)),
      stub_(loom::v1::NodeService::NewStub(channel)),
      shared_(shared) {}

void SchedNode::Start() {
  stub_->async()->Session(&context_, this);
  AddHold();
  StartRead(&in_);
  NodeMessage message;
  loom::v1::RegisterNode* r = message.mutable_register_();
  r->set_node_id(id_);
  r->set_hostname(id_);
  r->set_address("127.0.0.1");
  r->mutable_labels()->insert(labels_.begin(), labels_.end());
  loom::v1::Device* d = r->add_devices();
  d->set_kind("gpu");
  d->set_count(gpus_);
  d->set_name("NVIDIA H200");
  d->set_memory_bytes(int64_t{143771} << 20);
  d->set_peak_flops(989e12);
  Send(std::move(message));
  StartCall();
}

void SchedNode::Send(NodeMessage message) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ended_) return;
    if (writing_) {
      outbox_.push_back(std::move(message));
      return;
    }
    writing_ = true;
    writing_message_ = std::move(message);
  }
  StartWrite(&writing_message_);
}

void SchedNode::OnWriteDone(bool ok) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!ok || ended_ || outbox_.empty()) {
      writing_ = false;
      if (!ok) outbox_.clear();
      return;
    }
    writing_message_ = std::move(outbox_.front());
    outbox_.pop_front();
  }
  StartWrite(&writing_message_);
}

void SchedNode::Heartbeat() {
  NodeMessage message;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ended_) return;
    loom::v1::Heartbeat* h = message.mutable_heartbeat();
    h->set_seq(++seq_);
    for (const Rank& rank : ranks_) {
      loom::v1::RunningRank* r = h->add_running();
      r->set_job_id(rank.job_id);
      r->set_attempt(rank.attempt);
      r->set_rank(rank.rank);
      r->set_pid(rank.pid);
    }
  }
  Send(std::move(message));
}

NodeMessage SchedNode::ExitLocked(const Rank& rank, int exit_code, int signal, absl::Time now) {
  NodeMessage message;
  loom::v1::RankExited* e = message.mutable_rank_exited();
  e->set_job_id(rank.job_id);
  e->set_attempt(rank.attempt);
  e->set_rank(rank.rank);
  e->set_exit_code(exit_code);
  e->set_signal(signal);
  e->set_exited_unix_us(absl::ToUnixMicros(now));
  shared_->ledger->Record(now, id_, rank.device, rank.job_id, /*launch=*/false);
  return message;
}

void SchedNode::EndDue(absl::Time now) {
  std::vector<NodeMessage> exits;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto done = std::stable_partition(ranks_.begin(), ranks_.end(),
                                      [now](const Rank& r) { return r.end > now; });
    for (auto it = done; it != ranks_.end(); ++it) exits.push_back(ExitLocked(*it, 0, 0, now));
    ranks_.erase(done, ranks_.end());
  }
  for (NodeMessage& exit : exits) Send(std::move(exit));
}

int64_t SchedNode::StepsOf(const loom::v1::RankAssignment& assignment) {
  {
    std::lock_guard<std::mutex> lock(shared_->steps_mu);
    if (auto it = shared_->steps.find(assignment.job_id()); it != shared_->steps.end()) {
      return it->second;
    }
  }
  absl::StatusOr<spec::JobSpec> spec = spec::ParseJobSpecYaml(assignment.spec_yaml(), "assignment");
  const int64_t steps = spec.ok() ? spec->train.steps : 1;
  if (!spec.ok()) {
    std::fprintf(stderr, "loom-loadgen: job %s: its spec does not parse (%s); it runs one step\n",
                 assignment.job_id().c_str(), spec.status().ToString().c_str());
  }
  std::lock_guard<std::mutex> lock(shared_->steps_mu);
  shared_->steps[assignment.job_id()] = steps;
  return steps;
}

void SchedNode::Launch(const loom::v1::RankAssignment& assignment) {
  const absl::Time now = absl::Now();
  const int64_t steps = StepsOf(assignment);
  std::lock_guard<std::mutex> lock(mu_);
  for (const Rank& r : ranks_) {
    // A launch of a rank still running is ignored, as loom-worker does.
    if (r.job_id == assignment.job_id() && r.attempt == assignment.attempt() &&
        r.rank == assignment.rank()) {
      return;
    }
  }
  Rank rank{.job_id = assignment.job_id(),
            .attempt = assignment.attempt(),
            .rank = assignment.rank(),
            .device = assignment.local_device(),
            .pid = shared_->next_pid++,
            .end = now + shared_->step * static_cast<double>(steps)};
  shared_->ledger->Record(now, id_, rank.device, rank.job_id, /*launch=*/true);
  ranks_.push_back(std::move(rank));
}

void SchedNode::Kill(const loom::v1::KillRanks& kill) {
  std::vector<NodeMessage> exits;
  const absl::Time now = absl::Now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto killed = std::stable_partition(ranks_.begin(), ranks_.end(), [&](const Rank& r) {
      if (r.job_id != kill.job_id()) return true;
      if (kill.attempt() != 0 && kill.attempt() != r.attempt) return true;
      if (kill.ranks_size() > 0 &&
          std::find(kill.ranks().begin(), kill.ranks().end(), r.rank) == kill.ranks().end()) {
        return true;
      }
      return false;
    });
    for (auto it = killed; it != ranks_.end(); ++it) exits.push_back(ExitLocked(*it, 0, 15, now));
    ranks_.erase(killed, ranks_.end());
  }
  for (NodeMessage& exit : exits) Send(std::move(exit));
}

void SchedNode::OnReadDone(bool ok) {
  if (!ok) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ended_ = true;
    }
    if (!shared_->shutting_down.load()) {
      shared_->sessions_ended++;
      std::fprintf(stderr, "loom-loadgen: node %s: session ended\n", id_.c_str());
    }
    RemoveHold();
    return;
  }
  switch (in_.kind_case()) {
    case loom::v1::CoordinatorMessage::kRegistered:
      shared_->registered++;
      break;
    case loom::v1::CoordinatorMessage::kLaunch:
      Launch(in_.launch().assignment());
      break;
    case loom::v1::CoordinatorMessage::kKill:
      Kill(in_.kill());
      break;
    default:  // heartbeat acks; no other command comes to ranks that report nothing
      break;
  }
  StartRead(&in_);
}

void SchedNode::OnDone(const grpc::Status&) {}

void SchedNode::Cancel() { context_.TryCancel(); }

}  // namespace loom::loadgen
