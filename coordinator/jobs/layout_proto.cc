#include "coordinator/jobs/layout_proto.h"

namespace loom::coordinator {

loom::v1::Layout LayoutToProto(const spec::Layout& l) {
  loom::v1::Layout out;
  out.set_dp(l.dp);
  out.set_tp(l.tp);
  out.set_pp(l.pp);
  out.set_cp(l.cp);
  out.set_ep(l.ep);
  out.set_zero_stage(l.zero_stage);
  out.set_schedule(spec::ScheduleName(l.schedule));
  out.set_virtual_stages(l.virtual_stages);
  out.set_sequence_parallel(l.sequence_parallel);
  out.set_recompute(spec::RecomputeName(l.recompute));
  out.set_micro_batch_size(l.micro_batch_size);
  out.set_grad_accum_steps(l.grad_accum);
  return out;
}

}  // namespace loom::coordinator
