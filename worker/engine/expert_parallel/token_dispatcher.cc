#include "worker/engine/expert_parallel/token_dispatcher.h"

#include <span>
#include <utility>

#include "absl/strings/str_cat.h"

namespace loom::engine {
namespace {

constexpr int64_t kInt32 = sizeof(int32_t);

kernels::Buffer ToBackend(kernels::Ops& ops, const std::vector<int32_t>& host) {
  kernels::Buffer b = ops.Allocate(static_cast<int64_t>(host.size()) * kInt32);
  if (!host.empty()) ops.CopyHostToDevice(b.data(), host.data(), static_cast<int64_t>(host.size()) * kInt32);
  return b;
}

std::vector<int64_t> Times(const std::vector<int64_t>& rows, int64_t width) {
  std::vector<int64_t> out(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) out[i] = rows[i] * width;
  return out;
}

}  // namespace

absl::StatusOr<TokenDispatcher> TokenDispatcher::Create(comm::Communicator* ep, kernels::Ops* ops,
                                                        int num_experts) {
  if (ep != nullptr && ep->size() <= 1) ep = nullptr;
  const int ranks = ep != nullptr ? ep->size() : 1;
  if (num_experts < 1 || num_experts % ranks != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expert dispatcher: model.moe.num_experts (", num_experts,
        ") must be a positive multiple of parallelism.ep (", ranks, "): experts are sharded evenly"));
  }
  return TokenDispatcher(ep, ops, num_experts);
}

absl::StatusOr<DispatchRoute> TokenDispatcher::Route(const int32_t* expert_ids, int64_t num_tokens,
                                                     int top_k) const {
  const int ranks = ep_size();
  const int local = local_experts();
  const int64_t assignments = num_tokens * top_k;
  DispatchRoute route;
  route.num_tokens = num_tokens;
  route.top_k = top_k;

  // Counting sort of the assignments by expert, stable: experts are
  // contiguous per rank, so this is also grouped by destination.
  std::vector<int64_t> per_expert(num_experts_, 0);
  for (int64_t a = 0; a < assignments; ++a) {
    const int32_t e = expert_ids[a];
    if (e >= num_experts_) {
      return absl::InvalidArgumentError(absl::StrCat("expert dispatcher: assignment ", a, " names expert ", e,
                                                     ", outside [0, ", num_experts_, ")"));
    }
    if (e >= 0) ++per_expert[e];
  }
  std::vector<int64_t> start(num_experts_ + 1, 0);
  for (int e = 0; e < num_experts_; ++e) start[e + 1] = start[e] + per_expert[e];
  route.sent_rows = start[num_experts_];
  std::vector<int32_t> send_assignment(route.sent_rows), send_token(route.sent_rows);
  {
    std::vector<int64_t> at(start.begin(), start.end() - 1);
    for (int64_t a = 0; a < assignments; ++a) {
      const int32_t e = expert_ids[a];
      if (e < 0) continue;
      send_assignment[at[e]] = static_cast<int32_t>(a);
      send_token[at[e]] = static_cast<int32_t>(a / top_k);
      ++at[e];
    }
  }
  route.send_counts.assign(ranks, 0);
  for (int e = 0; e < num_experts_; ++e) route.send_counts[e / local] += per_expert[e];

  // counts[s * local + le]: rows source s sends for my local expert le.
  // Integers over the integer all-to-all, in backend memory like the rows.
  std::vector<int64_t> counts(per_expert);
  if (ep_ != nullptr) {
    const int64_t bytes = static_cast<int64_t>(num_experts_) * static_cast<int64_t>(sizeof(int64_t));
    kernels::Buffer in = ops_->Allocate(bytes), out = ops_->Allocate(bytes);
    ops_->CopyHostToDevice(in.data(), per_expert.data(), bytes);
    ops_->Synchronize();
    const size_t n = static_cast<size_t>(num_experts_);
    if (absl::Status s = ep_->AllToAllInt64(std::span<const int64_t>(static_cast<const int64_t*>(in.data()), n),
                                            std::span<int64_t>(static_cast<int64_t*>(out.data()), n));
        !s.ok()) {
      return s;
    }
    ops_->CopyDeviceToHost(counts.data(), out.data(), bytes);
  }
  route.recv_counts.assign(ranks, 0);
  route.tokens_per_local_expert.assign(local, 0);
  for (int s = 0; s < ranks; ++s) {
    for (int le = 0; le < local; ++le) {
      const int64_t c = counts[s * local + le];
      if (c < 0) return absl::InternalError(absl::StrCat("expert dispatcher: rank ", s, " sent a negative count"));
      route.recv_counts[s] += c;
      route.tokens_per_local_expert[le] += c;
    }
  }
  for (int64_t c : route.tokens_per_local_expert) route.received_rows += c;

  // Received rows come by source rank, then local expert; the experts want
  // them by local expert, then source rank.
  std::vector<int64_t> received_at(static_cast<size_t>(ranks) * local, 0);  // [s][le] first received row
  {
    int64_t at = 0;
    for (int s = 0; s < ranks; ++s) {
      for (int le = 0; le < local; ++le) {
        received_at[s * local + le] = at;
        at += counts[s * local + le];
      }
    }
  }
  std::vector<int32_t> grouped_from_received(route.received_rows), received_from_grouped(route.received_rows);
  {
    int64_t g = 0;
    for (int le = 0; le < local; ++le) {
      for (int s = 0; s < ranks; ++s) {
        const int64_t first = received_at[s * local + le];
        for (int64_t i = 0; i < counts[s * local + le]; ++i, ++g) {
          grouped_from_received[g] = static_cast<int32_t>(first + i);
          received_from_grouped[first + i] = static_cast<int32_t>(g);
        }
      }
    }
  }
  route.send_assignment = ToBackend(*ops_, send_assignment);
  route.send_token = ToBackend(*ops_, send_token);
  route.grouped_from_received = ToBackend(*ops_, grouped_from_received);
  route.received_from_grouped = ToBackend(*ops_, received_from_grouped);
  return route;
}

absl::Status TokenDispatcher::Exchange(const float* in, const std::vector<int64_t>& send_rows, float* out,
                                       const std::vector<int64_t>& recv_rows, int64_t width) const {
  int64_t send_total = 0, recv_total = 0;
  for (int64_t r : send_rows) send_total += r;
  for (int64_t r : recv_rows) recv_total += r;
  ops_->Synchronize();  // the collective reads rows the ops may still be writing
  return ep_->AllToAll(std::span<const float>(in, static_cast<size_t>(send_total * width)), Times(send_rows, width),
                       std::span<float>(out, static_cast<size_t>(recv_total * width)), Times(recv_rows, width));
}

absl::Status TokenDispatcher::Forward(const DispatchRoute& route, const float* src, int64_t src_rows,
                                      const int32_t* index, int64_t width, float* out) const {
  kernels::Buffer send = ops_->AllocateFloats(route.sent_rows * width);
  ops_->EmbeddingForward(index, route.sent_rows, src, src_rows, width, send.f32());
  const float* received = send.f32();  // one rank: what it sends is what it gets
  kernels::Buffer recv;
  if (ep_ != nullptr) {
    recv = ops_->AllocateFloats(route.received_rows * width);
    if (absl::Status s = Exchange(send.f32(), route.send_counts, recv.f32(), route.recv_counts, width); !s.ok()) {
      return s;
    }
    received = recv.f32();
  }
  ops_->EmbeddingForward(route.grouped_from_received.i32(), route.received_rows, received, route.received_rows,
                         width, out);
  return absl::OkStatus();
}

absl::Status TokenDispatcher::Reverse(const DispatchRoute& route, const float* grouped, int64_t width,
                                      float* sent) const {
  if (ep_ == nullptr) {
    ops_->EmbeddingForward(route.received_from_grouped.i32(), route.received_rows, grouped, route.received_rows,
                           width, sent);
    return absl::OkStatus();
  }
  kernels::Buffer received = ops_->AllocateFloats(route.received_rows * width);
  ops_->EmbeddingForward(route.received_from_grouped.i32(), route.received_rows, grouped, route.received_rows,
                         width, received.f32());
  return Exchange(received.f32(), route.recv_counts, sent, route.send_counts, width);
}

absl::Status TokenDispatcher::Dispatch(const DispatchRoute& route, const float* x, int64_t width,
                                       float* out) const {
  return Forward(route, x, route.num_tokens, route.send_token.i32(), width, out);
}

absl::Status TokenDispatcher::CombineBackward(const DispatchRoute& route, const float* d_out, int64_t width,
                                              float* d_y) const {
  return Forward(route, d_out, route.num_tokens * route.top_k, route.send_assignment.i32(), width, d_y);
}

absl::Status TokenDispatcher::Combine(const DispatchRoute& route, const float* y, int64_t width, float* out) const {
  kernels::Buffer sent = ops_->AllocateFloats(route.sent_rows * width);
  if (absl::Status s = Reverse(route, y, width, sent.f32()); !s.ok()) return s;
  const int64_t rows = route.num_tokens * route.top_k;
  ops_->Fill(out, rows * width, 0.0f);
  // Each assignment receives at most one row: the accumulate is a scatter.
  ops_->EmbeddingBackward(route.send_assignment.i32(), route.sent_rows, sent.f32(), rows, width, out);
  return absl::OkStatus();
}

absl::Status TokenDispatcher::DispatchBackward(const DispatchRoute& route, const float* d_rows, int64_t width,
                                               float* d_x) const {
  kernels::Buffer sent = ops_->AllocateFloats(route.sent_rows * width);
  if (absl::Status s = Reverse(route, d_rows, width, sent.f32()); !s.ok()) return s;
  ops_->Fill(d_x, route.num_tokens * width, 0.0f);
  ops_->EmbeddingBackward(route.send_token.i32(), route.sent_rows, sent.f32(), route.num_tokens, width, d_x);
  return absl::OkStatus();
}

}  // namespace loom::engine
