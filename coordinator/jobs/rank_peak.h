// The peak FLOP/s a rank's MFU is measured against. A GPU's peak depends on
// the dtype its GEMMs run in, so it comes from common/hardware's table by the
// node's device name and the job's train.precision (fp32 -> fp32 without TF32,
// bf16 -> bf16, fp8 -> fp8); a CPU rank, or a GPU the table does not know, is
// measured against the peak its agent reported.
#pragma once

#include "common/spec/job_spec.h"
#include "coordinator/cluster/node_registry.h"

namespace loom::coordinator {

double RankPeakFlops(const NodeInfo& node, spec::Precision precision);

}  // namespace loom::coordinator
