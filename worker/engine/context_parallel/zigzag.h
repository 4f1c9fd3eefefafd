// Context parallelism's load-balanced causal split of one sequence (pure
// logic). The sequence is cut into 2 * cp equal chunks and rank r holds
// chunks r and 2 * cp - 1 - r (its "local chunk 0" and "local chunk 1"), so
// under the causal mask every rank attends to the same number of (query,
// key) pairs: the zigzag of Megatron-CP and the Ultra-Scale Playbook.
// docs/context_parallel.md draws it.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace loom::engine {

struct ZigzagSplit {
  int64_t seq_len = 0;  // the whole sequence
  int cp = 1;           // ranks in the CP group
  int64_t chunk = 0;    // seq_len / (2 * cp)

  // INVALID_ARGUMENT naming seq_len and cp when seq_len does not split into
  // 2 * cp equal chunks (or cp < 1).
  static absl::StatusOr<ZigzagSplit> Make(int64_t seq_len, int cp);

  // Tokens each rank holds per sequence (two chunks).
  int64_t local_seq() const { return 2 * chunk; }
  // The global chunk index of rank `rank`'s local chunk `c` (0 or 1).
  int64_t ChunkIndex(int rank, int c) const { return c == 0 ? rank : 2 * cp - 1 - rank; }
  // The position of that chunk's first token in the sequence.
  int64_t ChunkStart(int rank, int c) const { return ChunkIndex(rank, c) * chunk; }
  // RoPE position of each local token of `rank` (local_seq() entries).
  std::vector<int64_t> Positions(int rank) const;
};

// (query, key) pairs the mask leaves visible between one query chunk and one
// key chunk of `chunk` tokens each (global chunk indices): all of them
// without a causal mask; under it chunk^2 for an earlier key chunk, the
// lower triangle with the diagonal for the same chunk, none for a later one
// (that block is skipped).
int64_t VisiblePairs(bool causal, int64_t q_chunk, int64_t kv_chunk, int64_t chunk);

// Rank `rank`'s tokens of a [batch, seq_len] host array (ids, targets), its
// two chunks per sequence in local order: [batch, local_seq()].
template <typename T>
std::vector<T> LocalTokens(const ZigzagSplit& z, int rank, const T* full, int64_t batch) {
  std::vector<T> local(static_cast<size_t>(batch * z.local_seq()));
  for (int64_t b = 0; b < batch; ++b)
    for (int c = 0; c < 2; ++c)
      for (int64_t i = 0; i < z.chunk; ++i)
        local[(b * z.local_seq()) + c * z.chunk + i] =
            full[b * z.seq_len + z.ChunkStart(rank, c) + i];
  return local;
}

}  // namespace loom::engine
