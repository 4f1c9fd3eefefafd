// The layout a pipeline test runs: mesh sizes and schedule, applied to a job.
#pragma once

#include "common/spec/job_spec.h"

namespace loom::engine::testing {

struct PipelineLayout {
  int pp = 1, dp = 1, tp = 1;
  spec::Schedule schedule = spec::Schedule::k1F1B;
  int virtual_stages = 1;
  int zero_stage = 0;

  void ApplyTo(spec::JobSpec* job) const {
    job->parallelism.pp = pp;
    job->parallelism.dp = dp;
    job->parallelism.tp = tp;
    job->parallelism.schedule = schedule;
    job->parallelism.virtual_stages = virtual_stages;
    job->parallelism.zero_stage = zero_stage;
  }
};

}  // namespace loom::engine::testing
