// The expert-parallel token dispatcher: moves the rows of this rank's tokens
// to the ranks of the EP group that hold their experts, grouped by local
// expert, and brings the experts' outputs back in the original order.
// Experts are sharded contiguously: rank r holds experts
// [r*E/ep, (r+1)*E/ep). docs/expert_parallel.md draws the exchange.
//
// One batch's routing is a DispatchRoute, made once by Route() (the only
// exchange of control values: per-expert token counts, as integers) and then
// used by the four row movements, each one all-to-all of rows:
//   Dispatch          tokens [T, d]          -> expert rows [R, d]
//   Combine           expert rows [R, d]     -> assignment rows [T*k, d]
//   CombineBackward   d assignment rows      -> d expert rows      (= Dispatch)
//   DispatchBackward  d expert rows          -> d tokens, summed over k (= Combine)
// An assignment is one (token t, choice j) pair, index t*k + j; its expert id
// < 0 means dropped (over capacity): it is sent nowhere, and its Combine row
// is zero. The weighting of the k outputs by the router is the layer's.
//
// Row buffers are backend memory (`ops`); expert ids and counts are host
// values. Without an EP group (null or one rank) the same calls are the
// one-process permutation, no communication.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/ops.h"
#include "worker/comm/communicator.h"

namespace loom::engine {

// How one batch's assignments travel. Host vectors plus the index lists the
// row gathers use, already in backend memory.
struct DispatchRoute {
  int64_t num_tokens = 0;
  int top_k = 0;
  // Rows this rank sends to / receives from each EP rank.
  std::vector<int64_t> send_counts;
  std::vector<int64_t> recv_counts;
  // Rows this rank computes for each of its local experts, in order: the
  // expert-grouped buffer is these blocks back to back.
  std::vector<int64_t> tokens_per_local_expert;
  int64_t received_rows = 0;  // sum of tokens_per_local_expert
  int64_t sent_rows = 0;      // assignments not dropped

  // Send row i carries assignment send_assignment[i] (of token
  // send_assignment[i] / k); received row order -> expert-grouped order.
  kernels::Buffer send_assignment;  // int32 [sent_rows]
  kernels::Buffer send_token;       // int32 [sent_rows]
  kernels::Buffer grouped_from_received;  // int32 [received_rows]: grouped row i = received row [i]
  kernels::Buffer received_from_grouped;  // int32 [received_rows]: the inverse
};

class TokenDispatcher {
 public:
  // `ep` may be null (one rank). num_experts must be a positive multiple of
  // the group size; Create says which rule is broken otherwise.
  static absl::StatusOr<TokenDispatcher> Create(comm::Communicator* ep, kernels::Ops* ops,
                                                int num_experts);

  int ep_size() const { return ep_ != nullptr ? ep_->size() : 1; }
  int ep_rank() const { return ep_ != nullptr ? ep_->rank() : 0; }
  int num_experts() const { return num_experts_; }
  int local_experts() const { return num_experts_ / ep_size(); }
  int first_local_expert() const { return ep_rank() * local_experts(); }

  // expert_ids: host [num_tokens * top_k], each in [0, num_experts) or < 0
  // (dropped). Exchanges the per-expert counts with the group.
  absl::StatusOr<DispatchRoute> Route(const int32_t* expert_ids, int64_t num_tokens, int top_k) const;

  // x: [num_tokens, width] -> out: [received_rows, width], grouped by local
  // expert (within an expert: by source rank, then assignment order).
  absl::Status Dispatch(const DispatchRoute& route, const float* x, int64_t width, float* out) const;
  // y: [received_rows, width] expert-grouped -> out: [num_tokens * top_k,
  // width] in assignment order; dropped assignments' rows are zero.
  absl::Status Combine(const DispatchRoute& route, const float* y, int64_t width, float* out) const;
  // d_out: [num_tokens * top_k, width] -> d_y: [received_rows, width].
  absl::Status CombineBackward(const DispatchRoute& route, const float* d_out, int64_t width,
                               float* d_y) const;
  // d_rows: [received_rows, width] -> d_x: [num_tokens, width], overwritten
  // with the sum over each token's k assignments.
  absl::Status DispatchBackward(const DispatchRoute& route, const float* d_rows, int64_t width,
                                float* d_x) const;

 private:
  TokenDispatcher(comm::Communicator* ep, kernels::Ops* ops, int num_experts)
      : ep_(ep), ops_(ops), num_experts_(num_experts) {}

  // Rows [n, width] gathered by `index` from src (send order) -> exchanged
  // -> permuted into expert-grouped order in `out`.
  absl::Status Forward(const DispatchRoute& route, const float* src, int64_t src_rows,
                       const int32_t* index, int64_t width, float* out) const;
  // Expert-grouped rows -> back to the senders, in send order, in `sent`
  // ([sent_rows, width] backend memory).
  absl::Status Reverse(const DispatchRoute& route, const float* grouped, int64_t width,
                       float* sent) const;
  absl::Status Exchange(const float* in, const std::vector<int64_t>& send_rows, float* out,
                        const std::vector<int64_t>& recv_rows, int64_t width) const;

  comm::Communicator* ep_;
  kernels::Ops* ops_;
  int num_experts_;
};

}  // namespace loom::engine
