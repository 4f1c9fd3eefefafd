// The lifecycle's straggler side (job_lifecycle.h): each step report's
// timing feeds the attempt's StragglerDetector; a rank it flags or clears is
// named in the job (Job.stragglers, what `loomctl status` shows), recorded in
// the history, scored in loom_rank_straggler_score, and with
// fault_tolerance.straggler: replace moved off its node through the in-place
// restart, the node cordoned (docs/observability.md).
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "coordinator/jobs/job_lifecycle.h"

namespace loom::coordinator {
namespace {

// Ranks are compared with the ranks of their pipeline stage (the same layers,
// the same work): the stage is the PP(n) of the rank's place.
int StageOf(const std::string& place) {
  const size_t at = place.find("PP(");
  if (at == std::string::npos) return 0;
  int stage = 0;
  for (size_t i = at + 3; i < place.size() && place[i] >= '0' && place[i] <= '9'; ++i) {
    stage = stage * 10 + (place[i] - '0');
  }
  return stage;
}

std::string Describe(const StragglerScore& s, const loom::v1::RankPlacement& where) {
  return absl::StrFormat(
      "rank %d %s on node %s is a straggler since step %d: its compute %.2fx its peers' median "
      "(%.2fx its own earlier), score %.1f; it costs the job %.0f%% of its step time",
      s.rank, where.place(), where.node_id(), s.since_step, s.peer_ratio, s.self_ratio, s.score,
      100 * s.job_slowdown);
}

}  // namespace

void JobLifecycle::WatchAttemptLocked(JobRecord& record, absl::Time now) {
  record.hang = NewHangDetector(record, now);
  std::vector<int> stages;
  stages.reserve(record.placement->size());
  for (const auto& p : *record.placement) stages.push_back(StageOf(p.place()));
  record.straggler = std::make_unique<StragglerDetector>(options_.straggler_policy, std::move(stages));
  record.job.clear_stragglers();
}

bool JobLifecycle::ObserveTimingLocked(JobRecord& record, const loom::v1::RankProgress& progress) {
  if (!record.straggler) return false;
  StragglerDetector& detector = *record.straggler;
  if (!detector.Observe(progress.rank(), progress.step(), progress.timing().compute_seconds(),
                        progress.step_seconds())) {
    return false;
  }
  loom::v1::Job& job = record.job;
  for (int32_t rank : detector.PeersOf(progress.rank())) {
    metrics_->RankStragglerScore(job, rank, detector.Scores()[rank].score);
  }
  std::set<int32_t> before;
  for (const auto& s : job.stragglers()) before.insert(s.rank());
  const std::vector<StragglerScore> now = detector.Stragglers();
  std::set<int32_t> flagged;
  job.clear_stragglers();
  for (const StragglerScore& s : now) {
    flagged.insert(s.rank);
    const loom::v1::RankPlacement& where = record.placement->Get(s.rank);
    loom::v1::StragglerReport& r = *job.add_stragglers();
    r.set_rank(s.rank);
    r.set_place(where.place());
    r.set_node_id(where.node_id());
    r.set_score(s.score);
    r.set_peer_ratio(s.peer_ratio);
    r.set_self_ratio(s.self_ratio);
    r.set_job_slowdown(s.job_slowdown);
    r.set_since_step(s.since_step);
  }
  // The numbers move every step and go with the progress (soft); a rank
  // flagged or cleared is history (hard).
  for (int32_t rank : before) {
    if (!flagged.contains(rank)) {
      table_->RecordEventLocked(
          record, absl::StrCat("rank ", rank, " is no longer a straggler (step ", progress.step(), ")"));
    }
  }
  const StragglerScore* replace = nullptr;
  for (const StragglerScore& s : now) {
    if (before.contains(s.rank)) continue;
    table_->RecordEventLocked(record, Describe(s, record.placement->Get(s.rank)));
    if (replace == nullptr) replace = &s;
  }
  if (replace == nullptr || record.spec.fault_tolerance.straggler != spec::StragglerAction::kReplace ||
      job.state() != loom::v1::JobState::RUNNING) {
    return false;
  }
  const loom::v1::RankPlacement& where = record.placement->Get(replace->rank);
  HandleFailureLocked(record, {.kind = FailureKind::kStraggler,
                               .reason = absl::StrCat(Describe(*replace, where),
                                                      "; fault_tolerance.straggler: replace"),
                               .node_id = where.node_id(),
                               .rank = replace->rank,
                               .cause = absl::Now()});
  return true;
}

}  // namespace loom::coordinator
