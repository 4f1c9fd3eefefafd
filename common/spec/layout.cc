#include "common/spec/layout.h"

namespace loom::spec {

Layout LayoutOf(const JobSpec& spec) {
  const ParallelismSpec& p = spec.parallelism;
  Layout l;
  l.pp = p.pp.value_or(1);
  l.dp = p.dp.value_or(1);
  l.ep = p.ep.value_or(1);
  l.cp = p.cp.value_or(1);
  l.tp = p.tp.value_or(1);
  l.zero_stage = static_cast<int>(p.zero_stage.value_or(0));
  l.micro_batch_size = spec.train.micro_batch_size;
  const int64_t per_step = l.data_replicas() * spec.train.micro_batch_size;
  l.grad_accum = per_step > 0 ? spec.train.global_batch_size / per_step : 0;
  l.schedule = p.schedule;
  l.virtual_stages = p.virtual_stages;
  l.sequence_parallel = p.sequence_parallel;
  l.recompute = p.recompute;
  return l;
}

void ApplyLayout(const Layout& l, JobSpec* spec) {
  ParallelismSpec& p = spec->parallelism;
  p.auto_all = false;
  p.dp = l.dp;
  p.tp = l.tp;
  p.pp = l.pp;
  p.cp = l.cp;
  p.ep = l.ep;
  p.zero_stage = l.zero_stage;
  p.schedule = l.schedule;
  p.virtual_stages = l.virtual_stages;
  p.sequence_parallel = l.sequence_parallel;
  p.recompute = l.recompute;
  spec->train.micro_batch_size = l.micro_batch_size;
  spec->train.micro_batch_size_auto = false;
}

}  // namespace loom::spec
