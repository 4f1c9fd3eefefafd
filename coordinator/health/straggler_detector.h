// Straggler detection for one job attempt (docs/observability.md). Pure: fed
// with each rank's per-step compute time (its own work between collectives,
// RankProgress.timing), it scores every rank against its peers (the ranks of
// the same pipeline stage, which do the same work) and against its own
// history, and names the ranks that stay slower beyond a threshold.
//
// A job of a single rank is never scored: no one waits for it.
//
// Step time cannot show a straggler: under collectives every rank's step
// takes the same wall time, the fast ones waiting for the slow one. Compute
// time can: the slow rank's grows, its peers' waits absorb it.
//
// The score is robust: over a window of steps, a rank's summed compute
// against the median of its peers' sums, in units of their median absolute
// deviation (with a floor of a fraction of the median, so a few percent of
// noise between identical ranks never scores high). A periodic slowdown (a
// throttling GPU, a process stopped now and then) hits some steps and not
// others; the window's sum still carries it. A step is over when the score
// and the ratio to the median are over the thresholds and, among peers, the
// excess still stands (at half the bars) with each rank's largest step of the
// window left out (against its own past: at half the ratio). One hiccup (a
// rank descheduled once, for however long) stays in `window` sums but is
// never enough alone, so a rank need not stay over for longer than a window. It is flagged once `sustain` of its last
// `judge` steps were over, and cleared once fewer than half of that remain.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <vector>

namespace loom::coordinator {

struct StragglerPolicy {
  int window = 8;             // steps summed per score
  int judge = 8;              // of the last this many scores...
  int sustain = 6;            // ...this many over the thresholds flag a rank
  double threshold = 3.0;     // robust z-score over the peers' median
  double min_ratio = 1.15;    // and compute at least this multiple of the peers' median
  double noise_floor = 0.05;  // the deviation's floor, as a fraction of the median
  int min_peers = 3;          // fewer ranks in a stage: scored against its own history only
  int history = 64;           // steps of a rank's own history kept
};

struct StragglerScore {
  int32_t rank = -1;
  double score = 0;         // robust z-score against its peers (or its own history)
  double peer_ratio = 1;    // window compute / the peers' median
  double self_ratio = 1;    // window compute / its own earlier windows' median
  double job_slowdown = 0;  // the share of the window's step time spent waiting for it
  bool straggler = false;
  int64_t since_step = 0;   // flagged since this step
};

class StragglerDetector {
 public:
  // peer_class[r]: the class of rank r (its pipeline stage): ranks are
  // compared only with ranks of the same class.
  StragglerDetector(StragglerPolicy policy, std::vector<int> peer_class);

  // Rank `rank` finished `step` with `compute_seconds` of its own work in a
  // step of `step_seconds`. Returns true when this completed a step of the
  // rank's class and the scores changed. Reports of a step in any order;
  // a step older than the window is ignored.
  bool Observe(int32_t rank, int64_t step, double compute_seconds, double step_seconds);

  const std::vector<StragglerScore>& Scores() const { return scores_; }
  // The ranks compared with `rank` (its class, itself included).
  const std::vector<int32_t>& PeersOf(int32_t rank) const;
  // The flagged ranks, in rank order.
  std::vector<StragglerScore> Stragglers() const;

 private:
  struct Sample {
    double compute = 0;
    double step = 0;
  };
  struct RankTrack {
    std::map<int64_t, Sample> recent;  // by step, the last window + a few
    std::deque<double> own_windows;    // its window sums, oldest first (history)
    std::deque<bool> over;  // the last `judge` scores: over the thresholds?
    int over_count = 0;     // of them, over
  };
  void Evaluate(int cls, int64_t step);
  double WindowSum(const RankTrack& t, int64_t step, double Sample::*field) const;
  double WindowLargest(const RankTrack& t, int64_t step) const;  // of compute
  // The median of every other rank's newest self_ratio (1 before it has one).
  double OthersSelfRatio(int32_t rank) const;

  StragglerPolicy policy_;
  std::vector<int> peer_class_;
  std::map<int, std::vector<int32_t>> members_;         // by class
  std::map<int, std::map<int64_t, int>> reported_;      // by class: step -> ranks reported
  std::map<int, int64_t> evaluated_;                    // by class: newest step evaluated
  std::vector<RankTrack> tracks_;
  std::vector<StragglerScore> scores_;
};

}  // namespace loom::coordinator
