#include "coordinator/jobs/layout_proto.h"

namespace loom::coordinator {

loom::v1::Layout LayoutOf(const spec::JobSpec& spec) {
  const spec::ParallelismSpec& p = spec.parallelism;
  loom::v1::Layout layout;
  layout.set_dp(p.dp.value_or(1));
  layout.set_tp(p.tp.value_or(1));
  layout.set_pp(p.pp.value_or(1));
  layout.set_cp(p.cp.value_or(1));
  layout.set_ep(p.ep.value_or(1));
  layout.set_zero_stage(p.zero_stage.value_or(0));
  layout.set_schedule(spec::ScheduleName(p.schedule));
  layout.set_virtual_stages(p.virtual_stages);
  layout.set_sequence_parallel(p.sequence_parallel);
  layout.set_recompute(spec::RecomputeName(p.recompute));
  layout.set_micro_batch_size(spec.train.micro_batch_size);
  const int64_t per_step = layout.dp() * spec.train.micro_batch_size;
  layout.set_grad_accum_steps(per_step > 0 ? spec.train.global_batch_size / per_step : 0);
  return layout;
}

topology::MeshShape MeshShapeOf(const spec::JobSpec& spec) {
  const spec::ParallelismSpec& p = spec.parallelism;
  return topology::MeshShape{.pp = p.pp.value_or(1),
                             .dp = p.dp.value_or(1),
                             .ep = p.ep.value_or(1),
                             .cp = p.cp.value_or(1),
                             .tp = p.tp.value_or(1)};
}

}  // namespace loom::coordinator
