// A job's ranks running the trainer's epoch loop (worker/trainer/rank_epochs.h)
// as threads of the test, with the real pieces the loop talks to in process:
// one InProcessStore holding every attempt's namespace, a ControlMailbox per
// rank (the test posts AbortRanks and EnterEpoch as the agent would relay
// them), Gloo groups over loopback, and each rank's progress reports
// recorded. The test plays the coordinator's part: it watches the reports,
// picks the restore step from the holdings and moves the ranks on.
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
#include "gtest/gtest.h"
#include "common/topology/mesh.h"
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
inline std::string Token(int attempt, int rank) { return absl::StrCat("token-", attempt, "-", rank); }

class EpochCluster {
 public:
  // A dp x tp (x pp) job of `world` ranks; buddy[r]: rank r's buddy (-1 none).
  EpochCluster(spec::JobSpec job, const spec::Layout& layout, std::vector<int> buddy,
               double collective_timeout_s, std::string checkpoint_dir)
      : job_(std::move(job)), layout_(layout), buddy_(std::move(buddy)),
        timeout_s_(collective_timeout_s), checkpoint_dir_(std::move(checkpoint_dir)),
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
  int Ward(int rank) const {
    for (size_t r = 0; r < buddy_.size(); ++r) {
      if (buddy_[r] == rank) return static_cast<int>(r);
    }
    return -1;
  }
  loom::v1::SnapshotRing Ring(int rank) const {
    loom::v1::SnapshotRing ring;
    ring.set_buddy_rank(buddy_[static_cast<size_t>(rank)]);
    ring.set_ward_rank(Ward(rank));
    return ring;
  }

  // The assignment rank `rank` is launched with in `attempt`.
  loom::v1::RankAssignment Assignment(int rank, int attempt, const loom::v1::RestorePlan& restore,
                                      const loom::v1::SnapshotRing& ring) const {
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
    for (auto [axis, members] : {std::pair{"tp", groups->tp}, {"dp", groups->dp}, {"pp", groups->pp},
                                 {"cp", groups->cp}, {"ep", groups->ep}}) {
      loom::v1::GroupMembers* g = a.add_groups();
      g->set_axis(axis);
      proto::SetGroupMembers(members, g);
    }
    a.set_store_namespace(Namespace(attempt));
    a.set_rank_token(Token(attempt, rank));
    a.set_collective_timeout_s(timeout_s_);
    a.set_checkpoint_dir(checkpoint_dir_);
    *a.mutable_restore() = restore;
    *a.mutable_snapshots() = ring;
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
        return comm::CreateGroupCommunicator(store, "", axis, members, static_cast<int>(r), timeout);
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
      for (int r : ranks) all = all && !recorders_[static_cast<size_t>(r)]->Of(phase, attempt).empty();
      if (all) return true;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return false;
  }

  // The coordinator's choice: the newest step every survivor holds of its
  // own and whose copy the failed rank's buddy holds.
  int64_t RestoreStep(const std::vector<int>& survivors, int failed, int attempt) const {
    std::vector<int64_t> common;
    bool first = true;
    for (int r : survivors) {
      const auto aborted = recorders_[static_cast<size_t>(r)]->Of("aborted", attempt);
      if (aborted.empty()) return -1;
      const auto& own = aborted.back().snapshots().own_steps();
      std::vector<int64_t> mine(own.begin(), own.end());
      if (first) {
        common = mine;
        first = false;
      } else {
        std::vector<int64_t> both;
        for (int64_t s : common) {
          if (std::find(mine.begin(), mine.end(), s) != mine.end()) both.push_back(s);
        }
        common = both;
      }
    }
    const int buddy = buddy_[static_cast<size_t>(failed)];
    const auto held = recorders_[static_cast<size_t>(buddy)]->Of("aborted", attempt);
    if (held.empty() || held.back().snapshots().ward_rank() != failed) return -1;
    const auto& copies = held.back().snapshots().ward_steps();
    int64_t best = -1;
    for (int64_t s : common) {
      if (std::find(copies.begin(), copies.end(), s) != copies.end()) best = std::max(best, s);
    }
    return best;
  }

  // Moves the survivors on to `attempt` (rolling back to `step`) and
  // relaunches `failed` there, restoring from its buddy's copy.
  void RecoverInPlace(const std::vector<int>& survivors, int failed, int from_attempt, int attempt,
                      int64_t step) {
    const int helper = buddy_[static_cast<size_t>(failed)];
    for (int r : survivors) {
      loom::v1::RankControl control;
      loom::v1::EnterEpoch* e = control.mutable_enter_epoch();
      e->set_job_id("job-test");
      e->set_from_attempt(from_attempt);
      e->set_attempt(attempt);
      e->set_store_namespace(Namespace(attempt));
      e->set_restore_step(step);
      loom::v1::RankEpoch* entry = e->add_ranks();
      entry->set_rank(r);
      entry->set_rank_token(Token(attempt, r));
      *entry->mutable_snapshots() = Ring(r);
      if (r == helper) entry->mutable_snapshots()->add_send_snapshot_to(failed);
      mailboxes_[static_cast<size_t>(r)]->Post(control);
    }
    loom::v1::RestorePlan restore;
    restore.set_source(loom::v1::RestorePlan::PEER_SNAPSHOT);
    restore.set_step(step);
    restore.set_peer_rank(helper);
    Launch(Assignment(failed, attempt, restore, Ring(failed)));
  }

  void Abort(const std::vector<int>& ranks, int attempt, const std::string& reason) {
    loom::v1::RankControl control;
    control.mutable_abort()->set_job_id("job-test");
    control.mutable_abort()->set_attempt(attempt);
    control.mutable_abort()->set_reason(reason);
    for (int r : ranks) mailboxes_[static_cast<size_t>(r)]->Post(control);
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
  const spec::JobSpec job_;
  const spec::Layout layout_;
  const std::vector<int> buddy_;
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
