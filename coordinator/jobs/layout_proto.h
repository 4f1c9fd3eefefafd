// The job's layout (common/spec/layout.h) in its wire form, loom.v1.Layout:
// the one converter, used for a job's record, each rank's assignment and the
// planner's candidates.
#pragma once

#include "common/spec/layout.h"
#include "loom/v1/job.pb.h"

namespace loom::coordinator {

loom::v1::Layout LayoutToProto(const spec::Layout& layout);

}  // namespace loom::coordinator
