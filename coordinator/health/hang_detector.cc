#include "coordinator/health/hang_detector.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace loom::coordinator {
namespace {

// Ranks report at least every second; one silent this much longer than the
// freshest is not running.
constexpr absl::Duration kSilence = absl::Seconds(3);

}  // namespace

HangDetector::HangDetector(HangPolicy policy, std::vector<std::string> places, absl::Time start)
    : policy_(policy),
      places_(std::move(places)),
      ranks_(places_.size()),
      markers_(places_.size(), 0),
      last_progress_(start) {}

int64_t HangDetector::ProgressMarker(const loom::v1::RankProgress& p) const {
  // Steps dominate; completed collectives make finer progress visible.
  int64_t marker = p.step() * 1'000'000;
  for (const auto& g : p.groups()) marker += g.completed();
  return marker;
}

void HangDetector::Observe(const loom::v1::RankProgress& progress, absl::Time now) {
  const int32_t rank = progress.rank();
  if (rank < 0 || rank >= static_cast<int32_t>(ranks_.size())) return;
  RankView& view = ranks_[rank];
  view.seen = true;
  view.last_report = now;
  // Step records carry no phase or collectives: keep where the rank last said it was.
  if (progress.phase() != "step") view.last = progress;
  const int64_t marker = ProgressMarker(progress);
  if (marker > markers_[rank]) {
    markers_[rank] = marker;
    last_progress_ = now;
  }
  if (progress.step() > 0 && progress.phase() == "step") {
    any_step_ = true;
    slowest_step_s_ = std::max(slowest_step_s_, progress.step_seconds());
  }
}

absl::Duration HangDetector::Timeout() const {
  absl::Duration timeout = policy_.fixed_timeout;
  if (!any_step_) {
    // Startup (rendezvous, loading, the first step) gets its allowance with a
    // fixed timeout too: a spec's per-step timeout is no measure of it, and a
    // loaded machine once restarted a healthy job 4.2 s into its start on
    // hang_timeout_s: 4.
    timeout = std::max(timeout, policy_.first_step_allowance);
  } else if (timeout <= absl::ZeroDuration()) {
    timeout = std::max(policy_.floor, absl::Seconds(policy_.slowest_step_multiple * slowest_step_s_));
  }
  // A checkpoint save is slow but healthy: give it its own allowance.
  for (const RankView& view : ranks_) {
    if (view.seen && view.last.phase() == "checkpoint") return timeout + policy_.checkpoint_allowance;
  }
  return timeout;
}

std::optional<HangReport> HangDetector::Check(absl::Time now) const {
  const absl::Duration stalled = now - last_progress_;
  const absl::Duration timeout = Timeout();
  if (stalled < timeout) return std::nullopt;
  HangReport report = Diagnose(now);
  report.stalled_for = stalled;
  report.timeout = timeout;
  report.diagnosis = absl::StrCat("no progress for ", absl::FormatDuration(absl::Trunc(stalled, absl::Milliseconds(100))),
                                  " (timeout ", absl::FormatDuration(absl::Trunc(timeout, absl::Milliseconds(100))),
                                  "): ", report.diagnosis);
  return report;
}

std::string HangDetector::DescribeRank(int32_t rank, absl::Time now) const {
  if (rank < 0 || rank >= static_cast<int32_t>(ranks_.size())) return "";
  const RankView& view = ranks_[rank];
  if (!view.seen) return std::string("never reported");
  const auto& p = view.last;
  std::string phase = p.phase().empty() ? "unknown phase" : p.phase();
  if ((p.phase() == "forward_backward" || p.phase() == "forward" || p.phase() == "backward") &&
      p.micro_batch() >= 0) {
    absl::StrAppend(&phase, " of micro-batch ", p.micro_batch());
    if (p.chunk() > 0) absl::StrAppend(&phase, " (chunk ", p.chunk(), ")");
  }
  for (const auto& g : p.groups()) {
    if (!g.current_op().empty()) {
      absl::StrAppend(&phase, ", waiting in ", g.current_op(), " on ", g.group(), " #", g.issued());
    }
  }
  const absl::Time since =
      p.phase_since_unix_ms() > 0 ? absl::FromUnixMillis(p.phase_since_unix_ms()) : view.last_report;
  absl::StrAppend(&phase, " for ",
                  absl::FormatDuration(absl::Trunc(now - since, absl::Milliseconds(100))),
                  "; last report ",
                  absl::FormatDuration(absl::Trunc(now - view.last_report, absl::Milliseconds(100))),
                  " ago");
  return phase;
}

HangReport HangDetector::Diagnose(absl::Time now) const {
  HangReport report;

  // 1. A rank that never reported, or went silent while its peers still
  //    report (a stopped or wedged process), is the prime suspect.
  // 2. Otherwise the rank whose sequence number on some group lags its peers'.
  // 3. Otherwise whoever reported last the longest ago.
  int32_t culprit = -1;
  std::string why;
  absl::Time freshest = absl::InfinitePast();
  for (const RankView& view : ranks_) {
    if (view.seen) freshest = std::max(freshest, view.last_report);
  }
  absl::Time oldest = absl::InfiniteFuture();
  for (size_t r = 0; r < ranks_.size(); ++r) {
    if (!ranks_[r].seen) {
      culprit = static_cast<int32_t>(r);
      why = "it never reported";
      break;
    }
    if (ranks_[r].last_report < freshest - kSilence && ranks_[r].last_report < oldest) {
      oldest = ranks_[r].last_report;
      culprit = static_cast<int32_t>(r);
      why = "it stopped reporting while its peers still report";
    }
  }
  if (culprit < 0) {
    // Lowest issued count on a group whose members disagree.
    std::map<std::string, std::vector<std::pair<int64_t, int32_t>>> by_group;
    for (size_t r = 0; r < ranks_.size(); ++r) {
      for (const auto& g : ranks_[r].last.groups()) {
        by_group[g.group()].push_back({g.issued(), static_cast<int32_t>(r)});
      }
    }
    for (auto& [group, members] : by_group) {
      std::sort(members.begin(), members.end());
      if (members.front().first < members.back().first) {
        culprit = members.front().second;
        why = absl::StrCat("its sequence number on group ", group, " is ", members.front().first,
                           " while its peers are at ", members.back().first);
        break;
      }
    }
  }
  if (culprit < 0) {
    // Everyone agrees on the collectives: blame whoever reported last longest ago.
    oldest = absl::InfiniteFuture();
    for (size_t r = 0; r < ranks_.size(); ++r) {
      if (ranks_[r].last_report < oldest) {
        oldest = ranks_[r].last_report;
        culprit = static_cast<int32_t>(r);
      }
    }
    why = "its reports stopped first";
  }
  report.culprit_rank = culprit;
  if (culprit >= 0) {
    report.diagnosis = absl::StrCat("rank ", culprit, " ", places_[culprit], " holds the job up (",
                                    why, "); it is in ", DescribeRank(culprit, now));
  } else {
    report.diagnosis = "no rank reported";
  }
  return report;
}

}  // namespace loom::coordinator
