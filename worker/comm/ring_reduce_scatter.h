// Reduce-scatter over a Gloo context as a ring: n-1 steps, each passing one
// partially reduced chunk to the right neighbour. Gloo 0.5 has no
// reduce-scatter with unbound buffers and timeouts, and this keeps the bytes
// on the wire at the ring volume, (n-1)/n of the input. Internal to the Gloo
// communicator.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

#include "gloo/context.h"
#include "worker/comm/communicator.h"

namespace loom::comm {

// Slot prefix for the ring's transfers, apart from Gloo's own collectives
// (0x01..0x08) and from user send/recv tags (prefix 0).
inline constexpr uint8_t kRingReduceScatterSlotPrefix = 0x40;

// in holds context.size chunks of `chunk` floats; out receives this rank's
// reduced chunk. Throws Gloo's exceptions; the caller converts them. Every
// wait ends by `deadline`.
void RingReduceScatter(gloo::Context& context, const float* in, float* out, size_t chunk, ReduceOp op,
                       uint32_t tag, std::chrono::steady_clock::time_point deadline);

}  // namespace loom::comm
