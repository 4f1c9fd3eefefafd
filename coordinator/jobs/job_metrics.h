// The job manager's metrics: what a job's life shows in Prometheus (jobs by
// state, a job's and each rank's progress, restarts, recovery phases,
// goodput), and when a job's series leave the scrape. A thin, null-safe layer
// over CoordinatorMetrics (service/metrics.h; null: tests without metrics)
// that knows the job's terms: a progress report, an incident, a job that
// ended. Thread-safe (CoordinatorMetrics is).
#pragma once

#include <map>
#include <optional>
#include <string>

#include "coordinator/service/metrics.h"
#include "loom/v1/job.pb.h"
#include "loom/v1/rank.pb.h"

namespace loom::coordinator {

class JobMetrics {
 public:
  explicit JobMetrics(CoordinatorMetrics* metrics) : metrics_(metrics) {}

  // loom_jobs{state}: every state, those without jobs at 0.
  void JobsByState(const std::map<loom::v1::JobState, int>& counts);
  // A rank's step report: its share of the job's tokens against its device's
  // peak (rank_peak_flops) and its memory.
  void RankStep(const loom::v1::Job& job, const loom::v1::RankProgress& progress, double world,
                double rank_peak_flops);
  // The job's progress after rank 0's step (its MFU computed against the
  // placement's peak), and its MoE load when reported.
  void JobStep(const loom::v1::Job& job, const loom::v1::JobProgress& progress,
               const loom::v1::RankProgress& rank0);
  // loom_rank_straggler_score: the rank's robust score against its peers
  // (coordinator/health/straggler_detector.h).
  void RankStragglerScore(const loom::v1::Job& job, int32_t rank, double score);
  void Goodput(const loom::v1::Job& job);
  // The ranks an attempt runs and the size the job asked for.
  void Ranks(const loom::v1::Job& job, int64_t running, int64_t requested);
  void Restart(const loom::v1::Job& job);
  // Counts a closed incident's measured phases in the recovery histogram.
  void Incident(const std::optional<loom::v1::RecoveryIncident>& incident);
  // Removes every series of the job and of its ranks.
  void RemoveJob(const loom::v1::Job& job, int ranks);

 private:
  CoordinatorMetrics* const metrics_;
};

}  // namespace loom::coordinator
