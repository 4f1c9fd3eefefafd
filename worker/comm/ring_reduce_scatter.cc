#include "worker/comm/ring_reduce_scatter.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "gloo/transport/unbound_buffer.h"
#include "gloo/types.h"

namespace loom::comm {
namespace {

std::chrono::milliseconds Remaining(std::chrono::steady_clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  // Gloo treats a zero timeout as "none"; one millisecond still expires.
  return std::max(left, std::chrono::milliseconds(1));
}

void Combine(const float* a, const float* b, float* dst, size_t n, ReduceOp op) {
  if (op == ReduceOp::kSum) {
    for (size_t i = 0; i < n; ++i) dst[i] = a[i] + b[i];
  } else {
    for (size_t i = 0; i < n; ++i) dst[i] = std::max(a[i], b[i]);
  }
}

}  // namespace

void RingReduceScatter(gloo::Context& context, const float* in, float* out, size_t chunk, ReduceOp op,
                       uint32_t tag, std::chrono::steady_clock::time_point deadline) {
  const int n = context.size;
  const int rank = context.rank;
  if (n == 1 || chunk == 0) {
    if (chunk > 0) std::memcpy(out, in, chunk * sizeof(float));
    return;
  }
  const int right = (rank + 1) % n;
  const int left = (rank + n - 1) % n;
  const uint64_t slot = gloo::Slot::build(kRingReduceScatterSlotPrefix, tag);
  const size_t bytes = chunk * sizeof(float);

  // Rank r starts the partial sum of chunk r-1; after n-1 hops every chunk k
  // has collected all n contributions and ends at rank k.
  std::vector<float> send_chunk(in + static_cast<size_t>(left) * chunk, in + static_cast<size_t>(left + 1) * chunk);
  std::vector<float> recv_chunk(chunk);
  auto send_buffer = context.createUnboundBuffer(send_chunk.data(), bytes);
  auto recv_buffer = context.createUnboundBuffer(recv_chunk.data(), bytes);

  for (int step = 0; step < n - 1; ++step) {
    const int k = ((rank - step - 2) % n + n) % n;  // the chunk arriving now
    recv_buffer->recv(left, slot);
    send_buffer->send(right, slot);
    recv_buffer->waitRecv(Remaining(deadline));
    send_buffer->waitSend(Remaining(deadline));
    const float* own = in + static_cast<size_t>(k) * chunk;
    float* dst = step == n - 2 ? out : send_chunk.data();
    Combine(recv_chunk.data(), own, dst, chunk, op);
  }
}

}  // namespace loom::comm
