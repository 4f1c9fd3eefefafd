// The expert-parallel token dispatcher: the ExpertExchange (the MoE layer's
// seam, worker/engine/model/moe_layer.h) over an EP group. Experts are
// sharded contiguously, rank r holding [r*E/n, (r+1)*E/n); the layer lays its
// routed rows out sorted by global expert, which is already grouped by the
// rank that holds the expert, so:
//   Plan      one integer all-to-all of the per-expert counts (E int64 per
//             rank; control values never travel as floats), from which each
//             rank knows what it receives from whom for each held expert;
//   Dispatch  one all-to-all of rows (uneven splits), then a block reorder
//             from (source rank, held expert) to (held expert, source rank);
//   Combine   the exact inverse: reorder back, all-to-all back.
// The backward of each is the other (ExpertExchange's DispatchBackward /
// CombineBackward). docs/expert_parallel.md draws it.
//
// Rows are backend memory; the reorder is one device copy per (source,
// expert) block, so no index buffers are needed.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/ops.h"
#include "worker/comm/communicator.h"
#include "worker/engine/model/moe_layer.h"

namespace loom::engine {

class EpExpertExchange final : public ExpertExchange {
 public:
  // `ep`: the EP group (null or one rank: every expert is local, and the
  // exchange is the identity). num_experts must be a positive multiple of
  // its size: INVALID_ARGUMENT naming model.moe.num_experts otherwise.
  static absl::StatusOr<std::unique_ptr<EpExpertExchange>> Create(comm::Communicator* ep,
                                                                  kernels::Ops* ops,
                                                                  int64_t num_experts);

  int64_t first_expert() const override { return rank_ * held_; }
  int64_t num_held() const override { return held_; }
  int ep_size() const { return ranks_; }

  // plan->detail: [ranks * held] rows source s sends for held expert i, at
  // s * held + i.
  absl::Status Plan(const std::vector<int64_t>& send_counts, ExchangePlan* plan) override;
  absl::Status Dispatch(const ExchangePlan& plan, const float* permuted, int64_t width,
                        float* grouped) override;
  absl::Status Combine(const ExchangePlan& plan, const float* grouped, int64_t width,
                       float* permuted) override;

 private:
  EpExpertExchange(comm::Communicator* ep, kernels::Ops* ops, int64_t num_experts);

  // Rows this rank sends to / receives from each rank under `plan`.
  std::vector<int64_t> SendRows(const ExchangePlan& plan) const;
  std::vector<int64_t> RecvRows(const ExchangePlan& plan) const;
  // Copies between the received order (by source, then held expert) and the
  // grouped order (by held expert, then source), either way.
  void Reorder(const ExchangePlan& plan, const float* from, int64_t width, float* to,
               bool to_grouped) const;
  absl::Status Exchange(const float* in, const std::vector<int64_t>& send_rows, float* out,
                        const std::vector<int64_t>& recv_rows, int64_t width) const;

  comm::Communicator* ep_;  // null: one rank
  kernels::Ops* ops_;
  int64_t num_experts_;
  int ranks_;
  int rank_;
  int64_t held_;
};

}  // namespace loom::engine
