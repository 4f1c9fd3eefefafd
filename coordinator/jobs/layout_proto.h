// A job's resolved layout as the wire contract and the mesh see it.
#pragma once

#include "common/spec/job_spec.h"
#include "common/topology/mesh.h"
#include "loom/v1/job.pb.h"

namespace loom::coordinator {

// The layout of a spec whose axes are all set (unset axes count as 1).
loom::v1::Layout LayoutOf(const spec::JobSpec& spec);
topology::MeshShape MeshShapeOf(const spec::JobSpec& spec);

}  // namespace loom::coordinator
