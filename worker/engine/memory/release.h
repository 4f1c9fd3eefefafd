// Returning a range of backend memory to "zero and not resident": ZeRO frees
// a gathered block's parameters and a reduced bucket's gradients this way
// while the model keeps its flat arrays (and so its pointers). On the CPU the
// whole pages inside the range go back to the OS (madvise(MADV_DONTNEED) on
// private anonymous memory reads back as zeros); the partial pages at the ends
// are zeroed in place. Other backends zero the range.
#pragma once

#include <cstdint>

#include "kernels/ops.h"

namespace loom::engine {

void ReleaseToZero(kernels::Ops& ops, float* data, int64_t count);

}  // namespace loom::engine
