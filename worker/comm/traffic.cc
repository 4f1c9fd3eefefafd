#include "worker/comm/traffic.h"

namespace loom::comm::traffic {

int64_t AllReduceBytes(int64_t bytes, int n) {
  if (n <= 1) return 0;
  return 2 * (n - 1) * bytes / n;
}

int64_t ReduceScatterBytes(int64_t in_bytes, int n) {
  if (n <= 1) return 0;
  return (n - 1) * in_bytes / n;
}

int64_t AllGatherBytes(int64_t in_bytes, int n) {
  if (n <= 1) return 0;
  return (n - 1) * in_bytes;
}

int BroadcastChildren(int n, int rank, int root) {
  if (n <= 1) return 0;
  // The tree Gloo's broadcast walks: virtual rank 0 is the root; in round i
  // every virtual rank whose low i bits are zero and whose bit i is zero
  // sends to the rank with bit i set.
  const int vrank = (rank - root + n) % n;
  int dim = 0;
  while ((1 << dim) < n) ++dim;
  int children = 0;
  int mask = (1 << dim) - 1;
  for (int i = 0; i < dim; ++i) {
    mask ^= (1 << i);
    if ((vrank & mask) != 0) continue;
    const int vpeer = vrank ^ (1 << i);
    if (vpeer >= n) continue;
    if ((vrank & (1 << i)) == 0) ++children;
  }
  return children;
}

int64_t BroadcastBytes(int64_t bytes, int n, int rank, int root) {
  return bytes * BroadcastChildren(n, rank, root);
}

int64_t AllToAllBytes(const std::vector<int64_t>& send_counts, int rank, int64_t element_bytes) {
  int64_t elements = 0;
  for (int i = 0; i < static_cast<int>(send_counts.size()); ++i) {
    if (i != rank) elements += send_counts[i];
  }
  return elements * element_bytes;
}

}  // namespace loom::comm::traffic
