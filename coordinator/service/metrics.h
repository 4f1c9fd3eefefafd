// The coordinator's Prometheus metrics (prometheus-cpp), served on
// --metrics_listen. Names are part of the user's contract: dashboards and
// alerts use them (see deploy/grafana).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "coordinator/service/indexed_job_series.h"
#include "coordinator/service/moe_metrics.h"

namespace loom::coordinator {

struct ProgressSample {
  double step = 0;
  double loss = 0;
  double step_seconds = 0;
  double tokens_per_second = 0;
  double mfu = 0;
  double memory_bytes = 0;  // per rank: a GPU's allocator peak, a CPU rank's resident set
};

class CoordinatorMetrics {
 public:
  // listen empty: metrics are kept but not served (tests).
  static absl::StatusOr<std::unique_ptr<CoordinatorMetrics>> Create(const std::string& listen);

  void SetJobsByState(const std::map<std::string, int>& counts);
  void SetNodes(int live_nodes, int cordoned_nodes,
                const std::map<std::string, int>& devices_by_kind);
  void CountRpc(const std::string& method, const std::string& code);
  // loom_node_progress_refused_total: progress reports a node sent for ranks
  // it does not run in their jobs' current attempts.
  void CountProgressRefused(int64_t reports);
  // The liveness board's totals (beats heard and refused so far).
  void SetLivenessBeats(int64_t heard, int64_t refused);
  void SetRankProgress(const std::string& job_id, const std::string& job_name, int rank,
                       const ProgressSample& sample);
  // loom_rank_straggler_score (docs/observability.md).
  void SetRankStragglerScore(const std::string& job_id, const std::string& job_name, int rank,
                             double score);
  void SetJobProgress(const std::string& job_id, const std::string& job_name,
                      const ProgressSample& sample, double tokens);
  void SetJobValLoss(const std::string& job_id, const std::string& job_name, double val_loss);
  // [moe] A job's expert load (moe_metrics.h), from rank 0's report.
  void SetJobMoe(const std::string& job_id, const std::string& job_name,
                 const loom::v1::MoeProgress& moe);
  void CountRestart(const std::string& job_id, const std::string& job_name);
  // One phase of a recovery (coordinator/health/recovery_accounting.h):
  // loom_recovery_phase_seconds{phase}, no job label, so its series are six.
  void ObserveRecoveryPhase(const std::string& phase, double seconds);
  // loom_job_goodput: the fraction of the job's wall time in steps that counted.
  void SetJobGoodput(const std::string& job_id, const std::string& job_name, double goodput);
  // loom_job_ranks (the ranks its attempt runs) and loom_job_requested_ranks
  // (the size it asked for): apart while an elastic job runs shrunk.
  void SetJobRanks(const std::string& job_id, const std::string& job_name, int64_t running,
                   int64_t requested);
  // Removes every series of a job and of its ranks 0..ranks-1: a job that
  // ended adds nothing to the scrape, so series do not pile up over jobs.
  void RemoveJob(const std::string& job_id, const std::string& job_name, int ranks);
  // Series currently exported by the per-job and per-rank families (tests).
  size_t JobSeriesCount();

  // The port actually bound (for listen ports of 0), or 0.
  int port() const { return port_; }
  // For metrics kept by their own parts (scheduler_metrics.h).
  prometheus::Registry& registry() { return *registry_; }

 private:
  CoordinatorMetrics();

  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;

  absl::Mutex mu_;
  // loom_rank_* (six gauges per rank): a report writes its rank's row, a job
  // that ended is one erase (indexed_job_series.h). Served beside registry_.
  std::shared_ptr<IndexedJobSeries> rank_series_;
  // loom_rank_straggler_score{job, job_name, rank}: the same kind of table.
  std::shared_ptr<IndexedJobSeries> rank_straggler_score_;
  prometheus::Family<prometheus::Gauge>& jobs_;
  prometheus::Family<prometheus::Gauge>& nodes_live_;
  prometheus::Family<prometheus::Gauge>& nodes_cordoned_;
  prometheus::Family<prometheus::Gauge>& devices_live_;
  prometheus::Family<prometheus::Counter>& rpcs_;
  prometheus::Counter& progress_refused_;
  prometheus::Family<prometheus::Counter>& beats_;
  prometheus::Counter& beats_heard_;
  prometheus::Counter& beats_refused_;
  prometheus::Family<prometheus::Gauge>& job_step_;
  prometheus::Family<prometheus::Gauge>& job_loss_;
  prometheus::Family<prometheus::Gauge>& job_val_loss_;
  prometheus::Family<prometheus::Gauge>& job_step_seconds_;
  prometheus::Family<prometheus::Gauge>& job_tokens_per_second_;
  prometheus::Family<prometheus::Gauge>& job_mfu_;
  prometheus::Family<prometheus::Gauge>& job_tokens_;
  prometheus::Family<prometheus::Counter>& job_restarts_;
  prometheus::Family<prometheus::Gauge>& job_goodput_;
  prometheus::Family<prometheus::Gauge>& job_ranks_;
  prometheus::Family<prometheus::Gauge>& job_requested_ranks_;
  prometheus::Family<prometheus::Histogram>& recovery_phase_seconds_;
  std::map<std::string, prometheus::Histogram*> recovery_phases_;  // by phase, made up front
  std::shared_ptr<IndexedJobSeries> expert_tokens_;      // [moe] served beside registry_
  std::unique_ptr<MoeMetrics> moe_ ABSL_GUARDED_BY(mu_);  // [moe]
};

}  // namespace loom::coordinator
