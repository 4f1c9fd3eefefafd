// The bytes a rank sends for each operation, as the counters report them:
// the standard algorithm volumes (ring for all-reduce, reduce-scatter and
// all-gather, binomial tree for broadcast, pairwise for all-to-all). Tests of
// the engine compare counters with these formulas; docs/comm.md explains them.
// Pure functions, no I/O.
#pragma once

#include <cstdint>
#include <vector>

namespace loom::comm::traffic {

// A ring all-reduce of `bytes` over n ranks: a reduce-scatter then an
// all-gather, each sending n-1 of the n chunks. 2*(n-1)*bytes/n, rounded down.
int64_t AllReduceBytes(int64_t bytes, int n);

// A ring reduce-scatter of an input of `in_bytes` (n chunks): n-1 chunks sent,
// (n-1)*in_bytes/n. With SP this plus AllGatherBytes of the shard equals
// AllReduceBytes of the full buffer.
int64_t ReduceScatterBytes(int64_t in_bytes, int n);

// A ring all-gather of a shard of `in_bytes`: every other rank's copy of it
// is forwarded once, (n-1)*in_bytes.
int64_t AllGatherBytes(int64_t in_bytes, int n);

// A binomial-tree broadcast of `bytes` from root: this rank sends the buffer
// once per child in the tree. Summed over the group it is (n-1)*bytes; the
// root sends ceil(log2(n)) copies.
int64_t BroadcastBytes(int64_t bytes, int n, int rank, int root);

// Number of children of `rank` in the binomial broadcast tree rooted at root.
int BroadcastChildren(int n, int rank, int root);

// A pairwise all-to-all: everything in send_counts except the part this rank
// keeps, times the element size.
int64_t AllToAllBytes(const std::vector<int64_t>& send_counts, int rank, int64_t element_bytes);

}  // namespace loom::comm::traffic
