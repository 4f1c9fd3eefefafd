#include "worker/comm/self_communicator.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace loom::comm {

SelfCommunicator::SelfCommunicator(std::string name) : name_(std::move(name)) {}

absl::Status SelfCommunicator::Begin(const std::string& op, int64_t logical_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_) {
    return absl::AbortedError(
        absl::StrCat("group ", name_, ": ", op, " not run: the communicator was stopped: aborted: ", abort_reason_));
  }
  OpCounters& counters = stats_[op];
  counters.calls += 1;
  counters.logical_bytes += logical_bytes;
  ++calls_;
  return absl::OkStatus();
}

absl::Status SelfCommunicator::Invalid(const std::string& op, const std::string& rule) const {
  return absl::InvalidArgumentError(absl::StrCat("group ", name_, ": ", op, ": ", rule));
}

absl::Status SelfCommunicator::AllReduce(std::span<float> data, ReduceOp) {
  return Begin("all_reduce", data.size_bytes());
}

std::unique_ptr<Work> SelfCommunicator::AllReduceAsync(std::span<float> data, ReduceOp op) {
  return std::make_unique<DoneWork>(AllReduce(data, op));
}

absl::Status SelfCommunicator::ReduceScatter(std::span<const float> in, std::span<float> out) {
  if (in.size() != out.size()) {
    return Invalid("reduce_scatter", absl::StrCat("in.size() (", in.size(), ") must equal out.size() (", out.size(),
                                                  ") times the group size (1)"));
  }
  if (absl::Status s = Begin("reduce_scatter", in.size_bytes()); !s.ok()) return s;
  std::copy(in.begin(), in.end(), out.begin());
  return absl::OkStatus();
}

absl::Status SelfCommunicator::AllGather(std::span<const float> in, std::span<float> out) {
  if (in.size() != out.size()) {
    return Invalid("all_gather", absl::StrCat("out.size() (", out.size(), ") must equal in.size() (", in.size(),
                                              ") times the group size (1)"));
  }
  if (absl::Status s = Begin("all_gather", out.size_bytes()); !s.ok()) return s;
  std::copy(in.begin(), in.end(), out.begin());
  return absl::OkStatus();
}

absl::Status SelfCommunicator::Broadcast(std::span<float> data, int root) {
  if (root != 0) return Invalid("broadcast", absl::StrCat("root ", root, " is outside the group [0, 1)"));
  return Begin("broadcast", data.size_bytes());
}

absl::Status SelfCommunicator::Send(std::span<const float>, int peer, uint32_t) {
  return Invalid("send", absl::StrCat("peer ", peer, " must be another rank, and a group of one has none"));
}

absl::Status SelfCommunicator::Recv(std::span<float>, int peer, uint32_t) {
  return Invalid("recv", absl::StrCat("peer ", peer, " must be another rank, and a group of one has none"));
}

absl::Status SelfCommunicator::AllToAll(std::span<const float> in, const std::vector<int64_t>& send_counts,
                                        std::span<float> out, const std::vector<int64_t>& recv_counts) {
  if (send_counts.size() != 1 || recv_counts.size() != 1 || send_counts[0] != static_cast<int64_t>(in.size()) ||
      recv_counts[0] != static_cast<int64_t>(out.size()) || in.size() != out.size()) {
    return Invalid("all_to_all", "a group of one needs send_counts == recv_counts == {in.size()} and "
                                 "in.size() == out.size()");
  }
  if (absl::Status s = Begin("all_to_all", in.size_bytes()); !s.ok()) return s;
  std::copy(in.begin(), in.end(), out.begin());
  return absl::OkStatus();
}

absl::Status SelfCommunicator::AllToAllInt64(std::span<const int64_t> in, std::span<int64_t> out) {
  if (in.size() != out.size()) {
    return Invalid("all_to_all_int64", absl::StrCat("in.size() (", in.size(), ") must equal out.size() (",
                                                    out.size(), ")"));
  }
  if (absl::Status s = Begin("all_to_all_int64", in.size_bytes()); !s.ok()) return s;
  std::copy(in.begin(), in.end(), out.begin());
  return absl::OkStatus();
}

absl::Status SelfCommunicator::Barrier() { return Begin("barrier", 0); }

CommStats SelfCommunicator::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void SelfCommunicator::Abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_) return;
  aborted_ = true;
  abort_reason_ = reason;
}

CommProgress SelfCommunicator::Progress() const {
  std::lock_guard<std::mutex> lock(mu_);
  CommProgress progress;
  progress.issued = calls_;
  progress.completed = calls_;
  return progress;
}

}  // namespace loom::comm
