// Hang detection and diagnosis for one job attempt. Pure: fed with the ranks'
// progress reports and the clock, it says when the job has made no progress
// for its timeout and which rank is to blame.
//
// Progress is any step completed or any collective completed on any rank, so
// a long step whose collectives still advance is not a hang, while ranks all
// waiting in one collective for a stopped peer are.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "loom/v1/rank.pb.h"

namespace loom::coordinator {

struct HangPolicy {
  absl::Duration fixed_timeout = absl::ZeroDuration();  // the spec's; zero: calibrated
  absl::Duration floor = absl::Seconds(10);             // calibrated timeout never below this
  double slowest_step_multiple = 5;                     // calibrated: this many slowest steps
  absl::Duration first_step_allowance = absl::Seconds(120);  // startup, rendezvous, first step
  absl::Duration checkpoint_allowance = absl::Seconds(120);  // added while a rank checkpoints
};

struct HangReport {
  absl::Duration stalled_for;
  absl::Duration timeout;
  int32_t culprit_rank = -1;
  std::string diagnosis;  // "rank 5 TP(1)-CP(0)-PP(1)-DP(0)-Rank(5) lags on group dp[1,5]: ..."
};

class HangDetector {
 public:
  HangDetector(HangPolicy policy, std::vector<std::string> places, absl::Time start);

  void Observe(const loom::v1::RankProgress& progress, absl::Time now);
  // The timeout in force now (calibrated, with allowances).
  absl::Duration Timeout() const;
  // A report when no progress was seen for Timeout(); nullopt otherwise.
  std::optional<HangReport> Check(absl::Time now) const;
  // Names the rank most likely to hold the others up, and why.
  HangReport Diagnose(absl::Time now) const;
  // Where `rank` was by its newest report: "backward of micro-batch 1,
  // waiting in all_reduce on dp[0,1,2,3] #312 for 18.2s; last report 0.4s
  // ago" ("never reported"; "" for a rank out of range).
  std::string DescribeRank(int32_t rank, absl::Time now) const;

 private:
  struct RankView {
    bool seen = false;
    absl::Time last_report;
    loom::v1::RankProgress last;
  };
  int64_t ProgressMarker(const loom::v1::RankProgress& progress) const;

  HangPolicy policy_;
  std::vector<std::string> places_;
  std::vector<RankView> ranks_;
  std::vector<int64_t> markers_;
  absl::Time last_progress_;
  bool any_step_ = false;
  double slowest_step_s_ = 0;
};

}  // namespace loom::coordinator
