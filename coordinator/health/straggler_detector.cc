#include "coordinator/health/straggler_detector.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <utility>

namespace loom::coordinator {
namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  const double upper = v[mid];
  if (v.size() % 2 == 1) return upper;
  return (upper + *std::max_element(v.begin(), v.begin() + mid)) / 2;
}

// The median absolute deviation, scaled to a standard deviation's units for
// normal noise (1.4826), floored at a fraction of the median.
double RobustScale(const std::vector<double>& v, double median, double floor_fraction) {
  std::vector<double> deviations;
  deviations.reserve(v.size());
  for (double x : v) deviations.push_back(std::abs(x - median));
  return std::max({1.4826 * Median(std::move(deviations)), floor_fraction * median, 1e-9});
}

}  // namespace

StragglerDetector::StragglerDetector(StragglerPolicy policy, std::vector<int> peer_class)
    : policy_(policy), peer_class_(std::move(peer_class)) {
  policy_.window = std::max(1, policy_.window);
  policy_.judge = std::max(1, policy_.judge);
  policy_.sustain = std::clamp(policy_.sustain, 1, policy_.judge);
  tracks_.resize(peer_class_.size());
  scores_.resize(peer_class_.size());
  for (size_t r = 0; r < peer_class_.size(); ++r) {
    members_[peer_class_[r]].push_back(static_cast<int32_t>(r));
    scores_[r].rank = static_cast<int32_t>(r);
  }
}

bool StragglerDetector::Observe(int32_t rank, int64_t step, double compute_seconds,
                                double step_seconds) {
  if (rank < 0 || rank >= static_cast<int32_t>(tracks_.size()) || step <= 0) return false;
  const int cls = peer_class_[rank];
  auto done = evaluated_.find(cls);
  if (done != evaluated_.end() && step <= done->second) return false;  // late or resent
  RankTrack& t = tracks_[rank];
  if (!t.recent.emplace(step, Sample{compute_seconds, step_seconds}).second) return false;
  // Kept: a window, and a few steps its peers may still be behind on.
  while (t.recent.size() > static_cast<size_t>(policy_.window) + 8) t.recent.erase(t.recent.begin());
  std::map<int64_t, int>& reported = reported_[cls];
  const int count = ++reported[step];
  // Steps some rank never reported (it was slow to start, or restarted)
  // would otherwise stay forever.
  while (!reported.empty() && reported.begin()->first < step - 2 * policy_.window - 8) {
    reported.erase(reported.begin());
  }
  if (count < static_cast<int>(members_[cls].size())) return false;
  reported.erase(reported.begin(), reported.upper_bound(step));
  evaluated_[cls] = step;
  Evaluate(cls, step);
  return true;
}

double StragglerDetector::WindowLargest(const RankTrack& t, int64_t step) const {
  double largest = 0;
  for (auto it = t.recent.lower_bound(step - policy_.window + 1);
       it != t.recent.end() && it->first <= step; ++it) {
    largest = std::max(largest, it->second.compute);
  }
  return largest;
}

double StragglerDetector::WindowSum(const RankTrack& t, int64_t step, double Sample::*field) const {
  double sum = 0;
  for (auto it = t.recent.lower_bound(step - policy_.window + 1);
       it != t.recent.end() && it->first <= step; ++it) {
    sum += it->second.*field;
  }
  return sum;
}

void StragglerDetector::Evaluate(int cls, int64_t step) {
  const std::vector<int32_t>& members = members_[cls];
  // A job of one rank slows no one: nothing to name.
  if (tracks_.size() == 1) return;
  // Every member needs a full window of this class's steps.
  for (int32_t r : members) {
    const RankTrack& t = tracks_[r];
    auto first = t.recent.lower_bound(step - policy_.window + 1);
    if (std::distance(first, t.recent.upper_bound(step)) < policy_.window) return;
  }
  std::vector<double> sums;
  std::vector<double> trimmed;  // each without its largest step
  std::vector<double> step_sums;
  for (int32_t r : members) {
    sums.push_back(WindowSum(tracks_[r], step, &Sample::compute));
    trimmed.push_back(sums.back() - WindowLargest(tracks_[r], step));
    step_sums.push_back(WindowSum(tracks_[r], step, &Sample::step));
  }
  const bool by_peers = static_cast<int>(members.size()) >= policy_.min_peers;
  const double peer_median = Median(sums);
  const double peer_scale = RobustScale(sums, peer_median, policy_.noise_floor);
  const double trimmed_median = Median(trimmed);
  const double trimmed_scale = RobustScale(trimmed, trimmed_median, policy_.noise_floor);
  const double window_seconds = Median(step_sums);
  std::vector<double> own_medians;
  for (size_t i = 0; i < members.size(); ++i) {
    const RankTrack& t = tracks_[members[i]];
    const bool has_history = static_cast<int>(t.own_windows.size()) >= policy_.window;
    own_medians.push_back(
        has_history ? Median(std::vector<double>(t.own_windows.begin(), t.own_windows.end())) : 0);
    scores_[members[i]].self_ratio = own_medians[i] > 0 ? sums[i] / own_medians[i] : 1;
  }
  for (size_t i = 0; i < members.size(); ++i) {
    RankTrack& t = tracks_[members[i]];
    StragglerScore& s = scores_[members[i]];
    const double sum = sums[i];
    const bool has_history = own_medians[i] > 0;
    const std::vector<double> own(t.own_windows.begin(), t.own_windows.end());
    const double own_median = own_medians[i];
    s.peer_ratio = peer_median > 0 ? sum / peer_median : 1;
    if (by_peers) {
      s.score = (sum - peer_median) / peer_scale;
      s.job_slowdown =
          window_seconds > 0 ? std::clamp((sum - peer_median) / window_seconds, 0.0, 1.0) : 0;
    } else if (has_history) {
      // Two ranks cannot outvote each other: each against its own past.
      s.score = (sum - own_median) / RobustScale(own, own_median, policy_.noise_floor);
      s.job_slowdown =
          window_seconds > 0 ? std::clamp((sum - own_median) / window_seconds, 0.0, 1.0) : 0;
    } else {
      s.score = 0;
      s.job_slowdown = 0;
    }
    // Against its own past, a slowdown every other rank of the job shares
    // (a loaded machine, a slower phase of the data) is not this rank's: its
    // ratio counts only above the others' median ratio to their own pasts.
    const double ratio =
        by_peers ? s.peer_ratio : s.self_ratio / std::max(1.0, OthersSelfRatio(members[i]));
    // Among peers, the excess must also stand without the window's largest
    // step (at half the bars): one hiccup, however long, is never enough.
    // Against its own past, the window without its largest step against
    // the same share of its earlier windows.
    const double half_ratio = 1 + (policy_.min_ratio - 1) / 2;
    const double own_trimmed = own_median * (policy_.window - 1) / policy_.window;
    const bool recurring =
        by_peers ? (trimmed[i] - trimmed_median) / trimmed_scale > policy_.threshold / 2 &&
                       trimmed_median > 0 && trimmed[i] / trimmed_median > half_ratio
                 : own_trimmed > 0 && trimmed[i] / own_trimmed > half_ratio;
    const bool over = s.score > policy_.threshold && ratio > policy_.min_ratio && recurring;
    t.over.push_back(over);
    t.over_count += over ? 1 : 0;
    while (static_cast<int>(t.over.size()) > policy_.judge) {
      t.over_count -= t.over.front() ? 1 : 0;
      t.over.pop_front();
    }
    if (!s.straggler && t.over_count >= policy_.sustain) {
      s.straggler = true;
      s.since_step = step;
    } else if (s.straggler && 2 * t.over_count < policy_.sustain) {
      s.straggler = false;
      s.since_step = 0;
    }
    // The history is of normal windows: a slow spell does not become the
    // baseline it is measured against.
    if (!over && !s.straggler) {
      t.own_windows.push_back(sum);
      while (static_cast<int>(t.own_windows.size()) > policy_.history) t.own_windows.pop_front();
    }
  }
}

double StragglerDetector::OthersSelfRatio(int32_t rank) const {
  std::vector<double> others;
  for (const StragglerScore& other : scores_) {
    if (other.rank != rank) others.push_back(other.self_ratio);
  }
  return others.empty() ? 1 : Median(std::move(others));
}

const std::vector<int32_t>& StragglerDetector::PeersOf(int32_t rank) const {
  static const std::vector<int32_t> kNone;
  if (rank < 0 || rank >= static_cast<int32_t>(peer_class_.size())) return kNone;
  return members_.at(peer_class_[rank]);
}

std::vector<StragglerScore> StragglerDetector::Stragglers() const {
  std::vector<StragglerScore> out;
  for (const StragglerScore& s : scores_) {
    if (s.straggler) out.push_back(s);
  }
  return out;
}

}  // namespace loom::coordinator
