#include "worker/engine/context_parallel/zigzag.h"

#include "absl/strings/str_cat.h"

namespace loom::engine {

absl::StatusOr<ZigzagSplit> ZigzagSplit::Make(int64_t seq_len, int cp) {
  if (cp < 1) return absl::InvalidArgumentError(absl::StrCat("context parallelism: cp ", cp, " must be >= 1"));
  if (seq_len <= 0 || seq_len % (2 * int64_t{cp}) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "context parallelism splits each sequence into 2 * cp = ", 2 * cp,
        " equal chunks (the zigzag split): seq_len ", seq_len, " is not divisible by ", 2 * cp,
        " (cp ", cp, "); pick a seq_len that is a multiple of 2 * cp"));
  }
  ZigzagSplit z;
  z.seq_len = seq_len;
  z.cp = cp;
  z.chunk = seq_len / (2 * cp);
  return z;
}

std::vector<int64_t> ZigzagSplit::Positions(int rank) const {
  std::vector<int64_t> positions;
  positions.reserve(static_cast<size_t>(local_seq()));
  for (int c = 0; c < 2; ++c)
    for (int64_t i = 0; i < chunk; ++i) positions.push_back(ChunkStart(rank, c) + i);
  return positions;
}

int64_t VisiblePairs(bool causal, int64_t q_chunk, int64_t kv_chunk, int64_t chunk) {
  if (!causal || kv_chunk < q_chunk) return chunk * chunk;
  if (kv_chunk == q_chunk) return chunk * (chunk + 1) / 2;
  return 0;
}

}  // namespace loom::engine
