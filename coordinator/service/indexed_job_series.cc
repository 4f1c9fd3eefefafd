#include "coordinator/service/indexed_job_series.h"

#include <algorithm>
#include <utility>

namespace loom::coordinator {

IndexedJobSeries::IndexedJobSeries(std::string index_label, std::vector<Gauge> gauges)
    : index_label_(std::move(index_label)), gauges_(std::move(gauges)) {}

IndexedJobSeries::JobRows& IndexedJobSeries::RowsLocked(const std::string& job_id,
                                                        const std::string& job_name,
                                                        size_t rows) {
  JobRows& job = jobs_[job_id];
  job.job_name = job_name;
  if (rows > job.rows) {
    job.rows = rows;
    job.values.resize(rows * gauges_.size(), 0.0);
    job.set.resize(rows, false);
  }
  return job;
}

void IndexedJobSeries::SetRow(const std::string& job_id, const std::string& job_name, size_t index,
                              std::span<const double> values) {
  if (index >= kMaxRows || values.size() != gauges_.size()) return;
  absl::MutexLock lock(&mu_);
  JobRows& job = RowsLocked(job_id, job_name, index + 1);
  std::copy(values.begin(), values.end(), job.values.begin() + index * gauges_.size());
  job.set[index] = true;
}

void IndexedJobSeries::SetColumn(const std::string& job_id, const std::string& job_name,
                                 std::span<const double> values) {
  if (gauges_.size() != 1) return;
  const size_t rows = std::min(values.size(), kMaxRows);
  absl::MutexLock lock(&mu_);
  JobRows& job = RowsLocked(job_id, job_name, rows);
  std::copy(values.begin(), values.begin() + rows, job.values.begin());
  std::fill(job.set.begin(), job.set.begin() + rows, true);
}

void IndexedJobSeries::RemoveJob(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  jobs_.erase(job_id);
}

size_t IndexedJobSeries::SeriesCount() const {
  absl::MutexLock lock(&mu_);
  size_t count = 0;
  for (const auto& [id, job] : jobs_) {
    count += gauges_.size() * static_cast<size_t>(std::count(job.set.begin(), job.set.end(), true));
  }
  return count;
}

std::vector<prometheus::MetricFamily> IndexedJobSeries::Collect() const {
  std::vector<prometheus::MetricFamily> families(gauges_.size());
  for (size_t g = 0; g < gauges_.size(); ++g) {
    families[g].name = gauges_[g].name;
    families[g].help = gauges_[g].help;
    families[g].type = prometheus::MetricType::Gauge;
  }
  // Copied out (a few memcpys) so a scrape never holds up a report.
  std::map<std::string, JobRows> jobs;
  {
    absl::MutexLock lock(&mu_);
    jobs = jobs_;
  }
  for (const auto& [id, job] : jobs) {
    for (size_t row = 0; row < job.rows; ++row) {
      if (!job.set[row]) continue;
      // Labels in name order, as prometheus-cpp's families write them.
      std::vector<prometheus::ClientMetric::Label> labels = {
          {index_label_, std::to_string(row)}, {"job", id}, {"job_name", job.job_name}};
      std::sort(labels.begin(), labels.end());
      for (size_t g = 0; g < gauges_.size(); ++g) {
        prometheus::ClientMetric m;
        m.label = labels;
        m.gauge.value = job.values[row * gauges_.size() + g];
        families[g].metric.push_back(std::move(m));
      }
    }
  }
  // A family without series is left out, as the registry's would be.
  std::erase_if(families, [](const prometheus::MetricFamily& f) { return f.metric.empty(); });
  return families;
}

}  // namespace loom::coordinator
