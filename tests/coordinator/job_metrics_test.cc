// The job manager's metrics (coordinator/jobs/job_metrics.h) on real
// Prometheus families (not served): every state has its gauge, RECOVERING
// included, a job's series go when it is removed, and without metrics
// nothing happens.
#include "coordinator/jobs/job_metrics.h"

#include "gtest/gtest.h"

namespace loom::coordinator {
namespace {

TEST(JobMetrics, StatesStepsAndRemoval) {
  auto metrics = CoordinatorMetrics::Create("");
  ASSERT_TRUE(metrics.ok());
  JobMetrics job_metrics(metrics->get());
  job_metrics.JobsByState({{loom::v1::RUNNING, 2}});
  loom::v1::Job job;
  job.set_id("job-1");
  job.set_name("tiny");
  loom::v1::RankProgress rank;
  rank.set_rank(1);
  rank.set_step(3);
  rank.set_tokens_per_second(100);
  rank.set_flops_per_token(10);
  job_metrics.RankStep(job, rank, 2, 1000);
  loom::v1::JobProgress progress;
  progress.set_step(3);
  job_metrics.JobStep(job, progress, rank);
  EXPECT_GT((*metrics)->JobSeriesCount(), 0u);
  job_metrics.RemoveJob(job, 2);
  EXPECT_EQ((*metrics)->JobSeriesCount(), 0u);

  JobMetrics none(nullptr);  // tests without metrics
  none.JobsByState({});
  none.RankStep(job, rank, 2, 1000);
  none.RemoveJob(job, 2);
}

}  // namespace
}  // namespace loom::coordinator
