#include "tools/loadgen/fault_run.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

extern char** environ;

namespace loom::loadgen {
namespace {

// `perf record -g` of a process for as long as this lives (Debian's
// linux-perf; a perf that cannot start records nothing and says so).
class PerfRecord {
 public:
  PerfRecord(int pid, const std::string& out) {
    if (pid <= 0 || out.empty()) return;
    std::vector<std::string> args = {"perf", "record",          "-g", "-F", "499",
                                     "-p",   absl::StrCat(pid), "-o", out};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
    if (posix_spawnp(&pid_, "perf", &actions, nullptr, argv.data(), environ) != 0) {
      std::fprintf(stderr, "loom-loadgen: perf could not be started; no profile in %s\n",
                   out.c_str());
      pid_ = 0;
    }
    posix_spawn_file_actions_destroy(&actions);
  }
  ~PerfRecord() { Stop(); }
  bool started() const { return pid_ > 0; }
  void Stop() {
    if (pid_ <= 0) return;
    kill(pid_, SIGINT);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = 0;
  }

 private:
  pid_t pid_ = 0;
};

bool Ended(loom::v1::JobState s) {
  return s == loom::v1::SUCCEEDED || s == loom::v1::FAILED || s == loom::v1::CANCELLED;
}

// The newest incident of the failure of `attempt`.
const loom::v1::RecoveryIncident* IncidentOf(const loom::v1::Job& job, int32_t attempt) {
  const loom::v1::RecoveryIncident* found = nullptr;
  for (const auto& incident : job.incidents()) {
    if (incident.failed_attempt() == attempt) found = &incident;
  }
  return found;
}

absl::Time FromMicros(int64_t us) {
  return us > 0 ? absl::FromUnixMicros(us) : absl::InfiniteFuture();
}

std::string Seconds(double s) { return s < 0 ? std::string("-") : absl::StrFormat("%.2f s", s); }

}  // namespace

const char* FaultKindName(FaultPlan::Kind kind) {
  return kind == FaultPlan::kNode ? "node" : "crash";
}

absl::Time FaultOutcome::declared() const {
  return have_incident ? FromMicros(incident.declared_unix_us()) : absl::InfiniteFuture();
}

double FaultOutcome::DeclaredTo(absl::Time t) const {
  const absl::Time from = declared();
  if (from == absl::InfiniteFuture() || t == absl::InfiniteFuture()) return -1;
  return absl::ToDoubleSeconds(t - from);
}

double FaultOutcome::FaultToDeclared() const {
  const absl::Time to = declared();
  return to == absl::InfiniteFuture() ? -1 : absl::ToDoubleSeconds(to - fault_at);
}

FaultOutcome RunFault(FakeCluster& cluster, CoordinatorProbe& probe, const FaultPlan& plan) {
  FaultOutcome out;
  out.failed_attempt = cluster.Clock().attempt;
  PerfRecord perf(plan.coordinator_pid, plan.perf_out);
  // perf takes a moment to attach to every thread (more on a loaded
  // machine); a fault injected at once loses the recovery's first phases.
  if (perf.started()) absl::SleepFor(absl::Seconds(1));
  const MessageCounts messages_before = cluster.stats().Messages();
  out.fault_at = absl::Now();
  if (plan.kind == FaultPlan::kNode) {
    absl::StatusOr<FakeCluster::LostNode> lost = cluster.LoseNodeOf(plan.rank);
    if (!lost.ok()) {
      out.failures.push_back(std::string(lost.status().message()));
      return out;
    }
    out.lost_node = lost->id;
    out.failed.insert(lost->ranks.begin(), lost->ranks.end());
  } else {
    if (absl::Status crashed = cluster.CrashRank(plan.rank); !crashed.ok()) {
      out.failures.push_back(std::string(crashed.message()));
      return out;
    }
    out.failed.insert(plan.rank);
  }

  // Until every rank of a later attempt reported a step past its base.
  const absl::Time deadline = out.fault_at + plan.wait;
  JobClock::View clock;
  while (absl::Now() < deadline) {
    clock = cluster.Clock();
    if (clock.attempt > out.failed_attempt) {
      out.next_attempt = clock.attempt;
      out.all_resumed = clock.all_resumed;
      if (clock.all_past_first_step != absl::InfiniteFuture()) {
        out.all_past_next_step = clock.all_past_first_step;
        out.recovered = true;
        break;
      }
    }
    if (Ended(probe.LastJob().state())) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  out.messages = cluster.stats().Messages() - messages_before;
  perf.Stop();

  // The incident completes when rank 0's first step of the next attempt
  // reaches the coordinator; the probe's poll (250 ms) shows it a little later.
  const absl::Time incident_deadline = absl::Now() + absl::Seconds(15);
  while (true) {
    const loom::v1::Job job = probe.LastJob();
    if (const loom::v1::RecoveryIncident* incident = IncidentOf(job, out.failed_attempt)) {
      out.have_incident = true;
      out.incident = *incident;
      if (incident->complete() || incident->closed() || !out.recovered) break;
    }
    if (absl::Now() > incident_deadline) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  absl::SleepFor(absl::Milliseconds(300));  // a CPU sample after the window
  const absl::Time from = out.declared() != absl::InfiniteFuture() ? out.declared() : out.fault_at;
  if (out.recovered) out.cpu_seconds = probe.CpuSecondsBetween(from, out.all_past_next_step);
  out.ranks_behind = cluster.RanksBehind(plan.job_id);
  out.stale_reports = cluster.stats().stale_reports.load();

  // What the run must show.
  auto fail = [&out](std::string why) { out.failures.push_back(std::move(why)); };
  if (!out.recovered) {
    fail(absl::StrCat("not every rank got past its next step within ",
                      absl::FormatDuration(plan.wait), " of the fault (attempt ", clock.attempt,
                      ": ", clock.resumed, " of ", clock.world_size, " resumed, ",
                      clock.past_first_step, " past their first step; job ",
                      loom::v1::JobState_Name(probe.LastJob().state()), ")"));
  }
  if (!out.have_incident) {
    fail(absl::StrCat("the job records no incident for the failure of attempt ",
                      out.failed_attempt));
  } else if (plan.expect_in_place && out.incident.path() != "in_place") {
    fail(absl::StrCat("the job recovered on the ", out.incident.path(), " path, not in place (",
                      out.incident.fallback_reason(), ")"));
  } else if (out.incident.path() == "in_place") {
    const std::set<int32_t> relaunched(out.incident.relaunched_ranks().begin(),
                                       out.incident.relaunched_ranks().end());
    if (relaunched != out.failed) {
      fail(absl::StrCat("relaunched ranks [", absl::StrJoin(relaunched, ", "),
                        "], but the ranks that died were [", absl::StrJoin(out.failed, ", "), "]"));
    }
  }
  const ClusterStats& s = cluster.stats();
  if (s.stale_reports > 0) {
    fail(absl::StrCat(s.stale_reports.load(),
                      " reports of ranks in an attempt older than one "
                      "their node had been told of"));
  }
  if (out.ranks_behind > 0) {
    fail(absl::StrCat(out.ranks_behind, " live ranks left in an attempt before ",
                      cluster.Clock().attempt));
  }
  if (s.restore_failures > 0 || s.restore_copies_missing > 0) {
    fail(absl::StrCat(s.restore_failures.load(),
                      " survivors told to roll back to a step they hold "
                      "no snapshot of, ",
                      s.restore_copies_missing.load(),
                      " restore copies owed by ranks that hold none"));
  }
  if (s.epoch_entries_skipped > 0) {
    fail(absl::StrCat(s.epoch_entries_skipped.load(),
                      " EnterEpoch entries for ranks their node does not run"));
  }
  if (s.ranks_gave_up > 0) {
    fail(absl::StrCat(s.ranks_gave_up.load(),
                      " aborted ranks got no EnterEpoch within their collective timeout"));
  }
  return out;
}

void PrintFault(const FaultPlan& plan, const FaultOutcome& out, double steady_cpu_fraction) {
  if (plan.kind == FaultPlan::kNode) {
    std::printf("--- fault: node %s lost with its ranks [%s] (--fail_rank=%d) in attempt %d ---\n",
                out.lost_node.c_str(), absl::StrJoin(out.failed, ",").c_str(), plan.rank,
                out.failed_attempt);
  } else {
    std::printf("--- fault: rank %d crashed in attempt %d ---\n", plan.rank, out.failed_attempt);
  }
  if (out.have_incident) {
    const loom::v1::RecoveryIncident& i = out.incident;
    std::printf("path:                %s%s, steps recomputed %lld\n", i.path().c_str(),
                i.path() == "in_place" ? absl::StrCat(" (relaunched ranks ",
                                                      absl::StrJoin(i.relaunched_ranks(), ","), ")")
                                             .c_str()
                                       : absl::StrCat(" (", i.fallback_reason(), ")").c_str(),
                static_cast<long long>(i.steps_recomputed()));
    std::printf("fault -> declared:   %s (the incident's detection phase %.2f s)\n",
                Seconds(out.FaultToDeclared()).c_str(), i.detection_seconds());
    if (i.path() == "in_place") {
      std::printf(
          "incident phases:     detection %.2f, abort %.2f, relaunch %.2f, rendezvous "
          "%.2f, restore %.2f, first step %.2f, total %.2f s%s\n",
          i.detection_seconds(), i.abort_seconds(), i.placement_seconds(), i.rendezvous_seconds(),
          i.checkpoint_load_seconds(), i.first_step_seconds(), i.total_seconds(),
          i.complete() ? "" : " (incomplete)");
    } else {
      std::printf(
          "incident phases:     detection %.2f, stopping %.2f, placement %.2f, "
          "rendezvous %.2f, checkpoint load %.2f, first step %.2f, total %.2f s%s\n",
          i.detection_seconds(), i.stopping_seconds(), i.placement_seconds(),
          i.rendezvous_seconds(), i.checkpoint_load_seconds(), i.first_step_seconds(),
          i.total_seconds(), i.complete() ? "" : " (incomplete)");
    }
  }
  std::printf(
      "declared -> every rank resumed: %s; -> every rank past its next step: %s "
      "(attempt %d; goal 5 s)\n",
      Seconds(out.DeclaredTo(out.all_resumed)).c_str(),
      Seconds(out.DeclaredTo(out.all_past_next_step)).c_str(), out.next_attempt);
  const double window = out.DeclaredTo(out.all_past_next_step);
  if (out.cpu_seconds >= 0 && window > 0) {
    std::printf(
        "coordinator CPU, declared -> all past: %.2f s over %.2f s (%.0f%% of a core; "
        "steady %.0f%%)\n",
        out.cpu_seconds, window, out.cpu_seconds / window * 100, steady_cpu_fraction * 100);
  }
  const MessageCounts& m = out.messages;
  std::printf(
      "messages, fault -> all past: from the coordinator %lld (abort %lld, enter_epoch "
      "%lld, launch %lld, kill %lld, resume %lld, heartbeat acks %lld); to it %lld "
      "(progress batches %lld with %lld reports, exits %lld, heartbeats %lld, store "
      "batches %lld with %lld ops, store gets %lld)\n",
      static_cast<long long>(m.from_coordinator()), static_cast<long long>(m.aborts),
      static_cast<long long>(m.enter_epochs), static_cast<long long>(m.launches),
      static_cast<long long>(m.kills), static_cast<long long>(m.resumes),
      static_cast<long long>(m.heartbeat_acks), static_cast<long long>(m.to_coordinator()),
      static_cast<long long>(m.batches), static_cast<long long>(m.reports),
      static_cast<long long>(m.exits), static_cast<long long>(m.heartbeats),
      static_cast<long long>(m.store_batches), static_cast<long long>(m.store_ops),
      static_cast<long long>(m.store_gets));
}

std::string FaultResultFields(const FaultPlan& plan, const FaultOutcome& out) {
  const loom::v1::RecoveryIncident& i = out.incident;
  const double window = out.DeclaredTo(out.all_past_next_step);
  return absl::StrFormat(
      "fail=%s fail_rank=%d path=%s relaunched=%d steps_recomputed=%lld fault_to_declared_s=%.2f "
      "detect_to_resumed_s=%.2f detect_to_next_step_s=%.2f incident_total_s=%.2f "
      "recovery_cpu_s=%.2f recovery_cpu_frac=%.3f msgs_from_coordinator=%lld "
      "msgs_to_coordinator=%lld aborts=%lld enter_epochs=%lld launches=%lld kills=%lld "
      "store_ops=%lld store_gets=%lld batches=%lld reports=%lld stale_reports=%lld "
      "ranks_behind=%d recovered=%d",
      FaultKindName(plan.kind), plan.rank, out.have_incident ? i.path() : std::string("none"),
      i.relaunched_ranks_size(), static_cast<long long>(i.steps_recomputed()),
      out.FaultToDeclared(), out.DeclaredTo(out.all_resumed), window, i.total_seconds(),
      out.cpu_seconds, out.cpu_seconds >= 0 && window > 0 ? out.cpu_seconds / window : -1.0,
      static_cast<long long>(out.messages.from_coordinator()),
      static_cast<long long>(out.messages.to_coordinator()),
      static_cast<long long>(out.messages.aborts),
      static_cast<long long>(out.messages.enter_epochs),
      static_cast<long long>(out.messages.launches), static_cast<long long>(out.messages.kills),
      static_cast<long long>(out.messages.store_ops),
      static_cast<long long>(out.messages.store_gets), static_cast<long long>(out.messages.batches),
      static_cast<long long>(out.messages.reports), static_cast<long long>(out.stale_reports),
      out.ranks_behind, out.recovered ? 1 : 0);
}

}  // namespace loom::loadgen
