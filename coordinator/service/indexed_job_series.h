// Gauges with one series per job and index (a job's ranks, a MoE job's
// experts), e.g. loom_rank_step{job, job_name, rank}, served as a collectable
// of their own rather than prometheus-cpp families. A family removes a series
// by a linear search over all of its series, so dropping a job's thousands of
// series was quadratic and held locks the scrape and the progress path need
// for minutes; here a job's series are one map entry: a report writes a row,
// and a job that ended is one erase. Rows per job are bounded by its caller
// (ranks of the placement; model.moe.num_experts, coordinator/jobs/
// report_bounds.h) and by kMaxRows. Thread-safe: its own mutex, held only to
// copy values in or out.
#pragma once

#include <cstddef>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace loom::coordinator {

class IndexedJobSeries : public prometheus::Collectable {
 public:
  static constexpr size_t kMaxRows = 1 << 20;
  struct Gauge {
    std::string name;
    std::string help;
  };
  // One column per gauge; rows are labelled `index_label`="0", "1", ...
  IndexedJobSeries(std::string index_label, std::vector<Gauge> gauges);

  // Row `index` of the job: values.size() must be the number of gauges.
  void SetRow(const std::string& job_id, const std::string& job_name, size_t index,
              std::span<const double> values);
  // Rows 0..n-1 of a one-gauge table at once (a step's expert load); rows
  // beyond keep their last values, as gauges do.
  void SetColumn(const std::string& job_id, const std::string& job_name,
                 std::span<const double> values);
  void RemoveJob(const std::string& job_id);
  size_t SeriesCount() const;
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  struct JobRows {
    std::string job_name;
    size_t rows = 0;
    std::vector<double> values;  // row-major, width gauges_.size()
    std::vector<bool> set;       // by row: reported at least once
  };
  JobRows& RowsLocked(const std::string& job_id, const std::string& job_name, size_t rows)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string index_label_;
  const std::vector<Gauge> gauges_;
  mutable absl::Mutex mu_;
  std::map<std::string, JobRows> jobs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace loom::coordinator
