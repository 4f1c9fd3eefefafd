// A job's ranks running the trainer's epoch loop (worker/trainer/rank_epochs.h)
// as threads of the test, with the real pieces the loop talks to in process:
// one InProcessStore holding every attempt's namespace, a ControlMailbox per
// rank (the test posts AbortRanks and EnterEpoch as the agent would relay
// them), Gloo groups over loopback, and each rank's progress reports
// recorded. The test plays the coordinator's part with the coordinator's own
// pure pieces: the snapshot ring (common/topology/snapshot_ring.h), the
// in-place decision from the survivors' "aborted" reports and the messages
// built from it (coordinator/jobs/in_place_policy.h, in_place_messages.h),
// which it delivers as the agent would: a survivor gets the EnterEpoch of its
// node with its own entry only, a relaunched rank its new assignment.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/topology/mesh.h"
#include "common/topology/snapshot_ring.h"
#include "coordinator/jobs/in_place_messages.h"
#include "coordinator/jobs/in_place_policy.h"
#include "gtest/gtest.h"
#include "proto/group_members.h"
#include "worker/comm/group_factory.h"
#include "worker/comm/in_process_store.h"
#include "worker/comm/prefix_store.h"
#include "worker/trainer/rank_epochs.h"

namespace loom::trainer::testing {

// A rank's progress sink: every report kept, with its attempt and rank.
class Recorder {
 public:
  void Add(loom::v1::RankProgress p) {
    std::lock_guard<std::mutex> lock(mu_);
    reports_.push_back(std::move(p));
  }
  std::vector<loom::v1::RankProgress> All() const {
    std::lock_guard<std::mutex> lock(mu_);
    return reports_;
  }
  // The reports of `phase` (and attempt, when >= 0).
  std::vector<loom::v1::RankProgress> Of(const std::string& phase, int attempt = -1) const {
    std::vector<loom::v1::RankProgress> out;
    for (const auto& p : All()) {
      if (p.phase() == phase && (attempt < 0 || p.attempt() == attempt)) out.push_back(p);
    }
    return out;
  }

 private:
  mutable std::mutex mu_;
  std::vector<loom::v1::RankProgress> reports_;
};

class RecordingSink : public ProgressSink {
 public:
  RecordingSink(Recorder* recorder, int attempt, int rank)
      : recorder_(recorder), attempt_(attempt), rank_(rank) {}
  void Report(loom::v1::RankProgress p) override {
    p.set_attempt(attempt_);
    p.set_rank(rank_);
    recorder_->Add(std::move(p));
  }
  bool Flush(absl::Duration) override { return true; }

 private:
  Recorder* recorder_;
  int attempt_, rank_;
};

inline std::string Namespace(int attempt) { return absl::StrCat("job-test/attempt-", attempt); }
inline std::string Token(int attempt, int rank) {
  return absl::StrCat("token-", attempt, "-", rank);
}

class EpochCluster {
 public:
  // The job's ranks placed node by node: ranks_per_node[i] consecutive ranks
  // on node "node-i", one device each.
  EpochCluster(spec::JobSpec job, const spec::Layout& layout,
               const std::vector<int>& ranks_per_node, double collective_timeout_s,
               std::string checkpoint_dir)
      : job_(std::move(job)),
        layout_(layout),
        slots_(Slots(ranks_per_node)),
        ring_(topology::BuildSnapshotRing(slots_)),
        timeout_s_(collective_timeout_s),
        checkpoint_dir_(std::move(checkpoint_dir)),
        mailboxes_(static_cast<size_t>(layout.world())),
        recorders_(static_cast<size_t>(layout.world())),
        results_(static_cast<size_t>(layout.world())),
        threads_(static_cast<size_t>(layout.world())) {
    for (auto& m : mailboxes_) m = std::make_unique<ControlMailbox>();
    for (auto& r : recorders_) r = std::make_unique<Recorder>();
  }
  ~EpochCluster() {
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
  }

  int world() const { return static_cast<int>(layout_.world()); }
  int Buddy(int rank) const { return static_cast<int>(ring_.BuddyOf(rank)); }

  // The assignment rank `rank` is launched with in attempt 1: the newest
  // checkpoint (none), its place in the ring.
  loom::v1::RankAssignment FirstAssignment(int rank) const {
    loom::v1::RankAssignment a = Assignment(rank, 1);
    *a.mutable_snapshots() = coordinator::SnapshotRingOf(ring_, rank);
    return a;
  }

  // The parts of an assignment of `attempt` that do not depend on recovery.
  loom::v1::RankAssignment Assignment(int rank, int attempt) const {
    auto mesh = topology::RankMesh::Create(layout_);
    EXPECT_TRUE(mesh.ok());
    loom::v1::RankAssignment a;
    a.set_job_id("job-test");
    a.set_attempt(attempt);
    a.set_rank(rank);
    a.set_world_size(world());
    loom::v1::Layout* l = a.mutable_layout();
    l->set_dp(layout_.dp);
    l->set_tp(layout_.tp);
    l->set_pp(layout_.pp);
    auto coord = mesh->CoordOf(rank);
    a.mutable_coords()->set_dp(static_cast<int32_t>(coord->dp));
    a.mutable_coords()->set_tp(static_cast<int32_t>(coord->tp));
    a.mutable_coords()->set_pp(static_cast<int32_t>(coord->pp));
    auto groups = mesh->GroupsOf(rank);
    for (auto [axis, members] : {std::pair{"tp", groups->tp},
                                 {"dp", groups->dp},
                                 {"pp", groups->pp},
                                 {"cp", groups->cp},
                                 {"ep", groups->ep}}) {
      loom::v1::GroupMembers* g = a.add_groups();
      g->set_axis(axis);
      proto::SetGroupMembers(members, g);
    }
    a.set_store_namespace(Namespace(attempt));
    a.set_rank_token(Token(attempt, rank));
    a.set_collective_timeout_s(timeout_s_);
    a.set_checkpoint_dir(checkpoint_dir_);
    a.set_node_id(slots_[static_cast<size_t>(rank)].node_id);
    a.set_local_device(static_cast<int32_t>(slots_[static_cast<size_t>(rank)].local_device));
    return a;
  }

  // Starts rank `rank` on its own thread (a new one for a relaunch).
  // after_step(attempt, step) runs after each step, as the fault drills do.
  void Launch(const loom::v1::RankAssignment& a,
              std::function<absl::Status(int attempt, int64_t step)> after_step = {}) {
    const size_t r = static_cast<size_t>(a.rank());
    if (threads_[r].joinable()) threads_[r].join();
    mailboxes_[r] = std::make_unique<ControlMailbox>();  // a new process has a new channel
    threads_[r] = std::thread([this, a, r, after_step] {
      RankWorld world;
      auto current_attempt = std::make_shared<int>(a.attempt());
      world.control = mailboxes_[r].get();
      world.monitor = false;
      world.open_store = [this](const std::string& ns, const std::string& token) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          opened_.push_back({ns, token});
        }
        return std::unique_ptr<comm::Store>(new comm::PrefixStore(store_, ns));
      };
      world.open_progress = [this, r](int attempt, const std::string&) {
        return std::unique_ptr<ProgressSink>(
            new RecordingSink(recorders_[r].get(), attempt, static_cast<int>(r)));
      };
      const absl::Duration timeout = absl::Seconds(timeout_s_);
      world.make_group = [r, timeout](comm::Store& store, const std::string& axis,
                                      const std::vector<int>& members) {
        return comm::CreateGroupCommunicator(store, "", axis, members, static_cast<int>(r),
                                             timeout);
      };
      world.on_attempt = [current_attempt](int attempt, const std::string&) {
        *current_attempt = attempt;
      };
      world.after_step = [after_step, current_attempt](int64_t step) {
        return after_step ? after_step(*current_attempt, step) : absl::OkStatus();
      };
      world.on_event = [r](const std::string& m) {
        std::fprintf(stderr, "[rank %zu] %s\n", r, m.c_str());
      };
      results_[r] = RunRankEpochs(a, job_, world);
    });
  }

  // Waits (bounded) until every rank in `ranks` reported `phase` in `attempt`.
  bool WaitForPhase(const std::vector<int>& ranks, const std::string& phase, int attempt,
                    absl::Duration bound = absl::Seconds(120)) const {
    const absl::Time give_up = absl::Now() + bound;
    while (absl::Now() < give_up) {
      bool all = true;
      for (int r : ranks)
        all = all && !recorders_[static_cast<size_t>(r)]->Of(phase, attempt).empty();
      if (all) return true;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return false;
  }

  // The coordinator's part after `failed` failed in `from_attempt` and every
  // survivor reported "aborted": the in-place decision from their reports,
  // then attempt `attempt`: each survivor its node's EnterEpoch (its own
  // entry), the failed rank relaunched with its new assignment. Returns the
  // decision (the restore step, who sends the relaunched rank its copy).
  absl::StatusOr<coordinator::InPlaceDecision> RecoverInPlace(int failed, int from_attempt,
                                                              int attempt) {
    coordinator::InPlaceRequest request;
    request.fault_tolerance = job_.fault_tolerance;
    request.tp = layout_.tp;
    request.placement = slots_;
    request.ring = ring_;
    request.failed_ranks = {failed};
    std::map<std::string, std::vector<int64_t>> devices;
    for (const topology::DeviceSlot& slot : slots_)
      devices[slot.node_id].push_back(slot.local_device);
    for (const auto& [node, free] : devices) request.nodes.push_back({node, free, false});
    for (int r = 0; r < world(); ++r) {
      if (r == failed) continue;
      const auto aborted = recorders_[static_cast<size_t>(r)]->Of("aborted", from_attempt);
      if (!aborted.empty()) request.aborted[r] = aborted.back();
    }
    for (const auto& p : recorders_[0]->Of("step", from_attempt)) {
      request.newest_step = std::max<int64_t>(request.newest_step, p.step());
    }
    absl::StatusOr<coordinator::InPlaceDecision> decision = coordinator::DecideInPlace(request);
    if (!decision.ok()) return decision.status();
    if (!decision->in_place) {
      return absl::FailedPreconditionError("not in place: " + decision->fallback_reason);
    }
    std::vector<loom::v1::RankAssignment> next;
    for (int r = 0; r < world(); ++r) next.push_back(Assignment(r, attempt));
    coordinator::ApplyInPlace(*decision, next);
    for (auto& [node, epoch] : coordinator::EnterEpochsByNode(*decision, next, from_attempt)) {
      for (const loom::v1::RankEpoch& entry : epoch.ranks()) {
        loom::v1::RankControl control;
        *control.mutable_enter_epoch() = epoch;
        control.mutable_enter_epoch()->clear_ranks();
        *control.mutable_enter_epoch()->add_ranks() = entry;  // as the agent relays it
        mailboxes_[static_cast<size_t>(entry.rank())]->Post(control);
      }
    }
    Launch(next[static_cast<size_t>(failed)]);
    return decision;
  }

  void Abort(const std::vector<int>& ranks, int attempt, const std::string& reason) {
    loom::v1::RankControl control;
    control.mutable_abort()->set_job_id("job-test");
    control.mutable_abort()->set_attempt(attempt);
    control.mutable_abort()->set_reason(reason);
    for (int r : ranks) mailboxes_[static_cast<size_t>(r)]->Post(control);
  }

  // A graceful stop (StopRanks) as the agent relays it to `rank`.
  void Stop(int rank, const std::string& reason) {
    loom::v1::RankControl control;
    control.mutable_stop()->set_job_id("job-test");
    control.mutable_stop()->set_attempt(1);
    control.mutable_stop()->set_reason(reason);
    mailboxes_[static_cast<size_t>(rank)]->Post(control);
  }

  void Join(int rank) {
    auto& t = threads_[static_cast<size_t>(rank)];
    if (t.joinable()) t.join();
  }
  void JoinAll() {
    for (int r = 0; r < world(); ++r) Join(r);
  }
  absl::Status result(int rank) const { return results_[static_cast<size_t>(rank)]; }
  const Recorder& reports(int rank) const { return *recorders_[static_cast<size_t>(rank)]; }
  std::vector<std::pair<std::string, std::string>> opened() const {
    std::lock_guard<std::mutex> lock(mu_);
    return opened_;
  }
  comm::InProcessStore& store() { return store_; }

 private:
  static std::vector<topology::DeviceSlot> Slots(const std::vector<int>& ranks_per_node) {
    std::vector<topology::DeviceSlot> slots;
    for (size_t n = 0; n < ranks_per_node.size(); ++n) {
      for (int d = 0; d < ranks_per_node[n]; ++d) slots.push_back({"node-" + std::to_string(n), d});
    }
    return slots;
  }

  const spec::JobSpec job_;
  const spec::Layout layout_;
  const std::vector<topology::DeviceSlot> slots_;
  const topology::SnapshotRing ring_;
  const double timeout_s_;
  const std::string checkpoint_dir_;
  comm::InProcessStore store_;
  std::vector<std::unique_ptr<ControlMailbox>> mailboxes_;
  std::vector<std::unique_ptr<Recorder>> recorders_;
  std::vector<absl::Status> results_;
  std::vector<std::thread> threads_;
  mutable std::mutex mu_;
  std::vector<std::pair<std::string, std::string>> opened_;
};

}  // namespace loom::trainer::testing
