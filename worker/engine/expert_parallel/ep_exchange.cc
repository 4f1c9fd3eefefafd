#include "worker/engine/expert_parallel/ep_exchange.h"

#include <span>
#include <utility>

#include "absl/strings/str_cat.h"

namespace loom::engine {
namespace {

constexpr int64_t kFloat = sizeof(float);

int64_t Sum(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

std::vector<int64_t> Times(const std::vector<int64_t>& rows, int64_t width) {
  std::vector<int64_t> out(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) out[i] = rows[i] * width;
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<EpExpertExchange>> EpExpertExchange::Create(comm::Communicator* ep,
                                                                           kernels::Ops* ops,
                                                                           int64_t num_experts) {
  const int ranks = ep != nullptr ? ep->size() : 1;
  if (num_experts < 1 || num_experts % ranks != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expert parallelism: model.moe.num_experts (", num_experts, ") must be a positive multiple of ",
        "parallelism.ep (", ranks, "): every EP rank holds the same number of experts"));
  }
  return std::unique_ptr<EpExpertExchange>(new EpExpertExchange(ep, ops, num_experts));
}

EpExpertExchange::EpExpertExchange(comm::Communicator* ep, kernels::Ops* ops, int64_t num_experts)
    : ep_(ep != nullptr && ep->size() > 1 ? ep : nullptr),
      ops_(ops),
      num_experts_(num_experts),
      ranks_(ep_ != nullptr ? ep_->size() : 1),
      rank_(ep_ != nullptr ? ep_->rank() : 0),
      held_(num_experts / ranks_) {}

absl::Status EpExpertExchange::Plan(const std::vector<int64_t>& send_counts, ExchangePlan* plan) {
  if (static_cast<int64_t>(send_counts.size()) != num_experts_) {
    return absl::InvalidArgumentError(absl::StrCat("expert exchange: ", send_counts.size(),
                                                   " send counts for ", num_experts_, " experts"));
  }
  for (int64_t c : send_counts) {
    if (c < 0) return absl::InvalidArgumentError("expert exchange: a send count is negative");
  }
  plan->send_counts = send_counts;
  std::vector<int64_t>& received = plan->detail;  // [source * held + expert]
  received.assign(send_counts.size(), 0);
  if (ep_ == nullptr) {
    received = send_counts;
  } else {
    // Chunk r of the counts (rank r's experts) goes to rank r; chunk s of
    // what arrives is source s's counts for this rank's experts. In backend
    // memory, the communicator's, like the rows.
    const int64_t bytes = num_experts_ * static_cast<int64_t>(sizeof(int64_t));
    kernels::Buffer in = ops_->Allocate(bytes), out = ops_->Allocate(bytes);
    ops_->CopyHostToDevice(in.data(), send_counts.data(), bytes);
    ops_->Synchronize();
    const auto n = static_cast<size_t>(num_experts_);
    if (absl::Status s = ep_->AllToAllInt64(std::span<const int64_t>(static_cast<const int64_t*>(in.data()), n),
                                            std::span<int64_t>(static_cast<int64_t*>(out.data()), n));
        !s.ok()) {
      return s;
    }
    ops_->CopyDeviceToHost(received.data(), out.data(), bytes);
    for (int64_t c : received) {
      if (c < 0) return absl::InternalError("expert exchange: a peer sent a negative count");
    }
  }
  plan->local_counts.assign(held_, 0);
  for (int s = 0; s < ranks_; ++s) {
    for (int64_t i = 0; i < held_; ++i) plan->local_counts[i] += received[s * held_ + i];
  }
  plan->grouped_rows = Sum(plan->local_counts);
  return absl::OkStatus();
}

std::vector<int64_t> EpExpertExchange::SendRows(const ExchangePlan& plan) const {
  std::vector<int64_t> rows(ranks_, 0);
  for (int64_t e = 0; e < num_experts_; ++e) rows[e / held_] += plan.send_counts[e];
  return rows;
}

std::vector<int64_t> EpExpertExchange::RecvRows(const ExchangePlan& plan) const {
  std::vector<int64_t> rows(ranks_, 0);
  for (int s = 0; s < ranks_; ++s) {
    for (int64_t i = 0; i < held_; ++i) rows[s] += plan.detail[s * held_ + i];
  }
  return rows;
}

void EpExpertExchange::Reorder(const ExchangePlan& plan, const float* from, int64_t width, float* to,
                               bool to_grouped) const {
  // First row of block (s, i) in the received order and in the grouped order.
  std::vector<int64_t> received_at(plan.detail.size()), grouped_at(plan.detail.size());
  int64_t at = 0;
  for (int s = 0; s < ranks_; ++s) {
    for (int64_t i = 0; i < held_; ++i) received_at[s * held_ + i] = at, at += plan.detail[s * held_ + i];
  }
  at = 0;
  for (int64_t i = 0; i < held_; ++i) {
    for (int s = 0; s < ranks_; ++s) grouped_at[s * held_ + i] = at, at += plan.detail[s * held_ + i];
  }
  for (size_t b = 0; b < plan.detail.size(); ++b) {
    const int64_t rows = plan.detail[b];
    if (rows == 0) continue;
    const int64_t src = to_grouped ? received_at[b] : grouped_at[b];
    const int64_t dst = to_grouped ? grouped_at[b] : received_at[b];
    ops_->CopyDeviceToDevice(to + dst * width, from + src * width, rows * width * kFloat);
  }
}

absl::Status EpExpertExchange::Exchange(const float* in, const std::vector<int64_t>& send_rows, float* out,
                                        const std::vector<int64_t>& recv_rows, int64_t width) const {
  ops_->Synchronize();  // the collective reads rows the ops may still be writing
  return ep_->AllToAll(std::span<const float>(in, static_cast<size_t>(Sum(send_rows) * width)),
                       Times(send_rows, width),
                       std::span<float>(out, static_cast<size_t>(Sum(recv_rows) * width)),
                       Times(recv_rows, width));
}

absl::Status EpExpertExchange::Dispatch(const ExchangePlan& plan, const float* permuted, int64_t width,
                                        float* grouped) {
  if (ep_ == nullptr) {
    if (grouped != permuted && plan.grouped_rows > 0) {
      ops_->CopyDeviceToDevice(grouped, permuted, plan.grouped_rows * width * kFloat);
    }
    return absl::OkStatus();
  }
  kernels::Buffer received = ops_->AllocateFloats(plan.grouped_rows * width);
  if (absl::Status s = Exchange(permuted, SendRows(plan), received.f32(), RecvRows(plan), width); !s.ok()) {
    return s;
  }
  Reorder(plan, received.f32(), width, grouped, /*to_grouped=*/true);
  return absl::OkStatus();
}

absl::Status EpExpertExchange::Combine(const ExchangePlan& plan, const float* grouped, int64_t width,
                                       float* permuted) {
  if (ep_ == nullptr) {
    if (grouped != permuted && plan.grouped_rows > 0) {
      ops_->CopyDeviceToDevice(permuted, grouped, plan.grouped_rows * width * kFloat);
    }
    return absl::OkStatus();
  }
  kernels::Buffer received = ops_->AllocateFloats(plan.grouped_rows * width);
  Reorder(plan, grouped, width, received.f32(), /*to_grouped=*/false);
  return Exchange(received.f32(), RecvRows(plan), permuted, SendRows(plan), width);
}

}  // namespace loom::engine
