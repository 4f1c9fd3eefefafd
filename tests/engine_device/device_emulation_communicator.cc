#include "tests/engine_device/device_emulation_communicator.h"

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace loom::engine::testing {

DeviceEmulationCommunicator::DeviceEmulationCommunicator(
    std::unique_ptr<comm::Communicator> inner, const DeviceEmulationOps* ops)
    : owned_(std::move(inner)), inner_(owned_.get()), ops_(ops) {}

DeviceEmulationCommunicator::DeviceEmulationCommunicator(comm::Communicator* inner,
                                                         const DeviceEmulationOps* ops)
    : inner_(inner), ops_(ops) {}

template <typename T>
std::span<T> DeviceEmulationCommunicator::Host(std::span<T> s, const char* op, const char* arg) {
  if (s.empty()) return s;
  const std::string who = absl::StrCat("DeviceEmulationCommunicator(", inner_->name(), ")::", op);
  void* host = ops_->HostAddress(s.data(), static_cast<int64_t>(s.size_bytes()), who.c_str(), arg);
  return std::span<T>(static_cast<T*>(host), s.size());
}

absl::Status DeviceEmulationCommunicator::AllReduce(std::span<float> data, comm::ReduceOp op) {
  auto host = Host(data, "AllReduce", "data");
  ++forwarded_;
  return inner_->AllReduce(host, op);
}

std::unique_ptr<comm::Work> DeviceEmulationCommunicator::AllReduceAsync(std::span<float> data,
                                                                        comm::ReduceOp op) {
  auto host = Host(data, "AllReduceAsync", "data");
  ++forwarded_;
  return inner_->AllReduceAsync(host, op);
}

absl::Status DeviceEmulationCommunicator::ReduceScatter(std::span<const float> in,
                                                        std::span<float> out) {
  auto host_in = Host(in, "ReduceScatter", "in");
  auto host_out = Host(out, "ReduceScatter", "out");
  ++forwarded_;
  return inner_->ReduceScatter(host_in, host_out);
}

absl::Status DeviceEmulationCommunicator::AllGather(std::span<const float> in,
                                                    std::span<float> out) {
  auto host_in = Host(in, "AllGather", "in");
  auto host_out = Host(out, "AllGather", "out");
  ++forwarded_;
  return inner_->AllGather(host_in, host_out);
}

absl::Status DeviceEmulationCommunicator::Broadcast(std::span<float> data, int root) {
  auto host = Host(data, "Broadcast", "data");
  ++forwarded_;
  return inner_->Broadcast(host, root);
}

absl::Status DeviceEmulationCommunicator::Send(std::span<const float> data, int peer,
                                               uint32_t tag) {
  auto host = Host(data, "Send", "data");
  ++forwarded_;
  return inner_->Send(host, peer, tag);
}

absl::Status DeviceEmulationCommunicator::Recv(std::span<float> data, int peer, uint32_t tag) {
  auto host = Host(data, "Recv", "data");
  ++forwarded_;
  return inner_->Recv(host, peer, tag);
}

std::unique_ptr<comm::Work> DeviceEmulationCommunicator::SendAsync(std::span<const float> data,
                                                                   int peer, uint32_t tag) {
  auto host = Host(data, "SendAsync", "data");
  ++forwarded_;
  return inner_->SendAsync(host, peer, tag);
}

std::unique_ptr<comm::Work> DeviceEmulationCommunicator::RecvAsync(std::span<float> data,
                                                                   int peer, uint32_t tag) {
  auto host = Host(data, "RecvAsync", "data");
  ++forwarded_;
  return inner_->RecvAsync(host, peer, tag);
}

absl::Status DeviceEmulationCommunicator::AllToAll(std::span<const float> in,
                                                   const std::vector<int64_t>& send_counts,
                                                   std::span<float> out,
                                                   const std::vector<int64_t>& recv_counts) {
  auto host_in = Host(in, "AllToAll", "in");
  auto host_out = Host(out, "AllToAll", "out");
  ++forwarded_;
  return inner_->AllToAll(host_in, send_counts, host_out, recv_counts);
}

absl::Status DeviceEmulationCommunicator::AllToAllInt64(std::span<const int64_t> in,
                                                        std::span<int64_t> out) {
  auto host_in = Host(in, "AllToAllInt64", "in");
  auto host_out = Host(out, "AllToAllInt64", "out");
  ++forwarded_;
  return inner_->AllToAllInt64(host_in, host_out);
}

std::vector<std::unique_ptr<comm::Communicator>> WrapGroup(
    std::vector<std::unique_ptr<comm::Communicator>> group,
    const std::vector<const DeviceEmulationOps*>& ops) {
  if (ops.size() != group.size()) {
    std::fprintf(stderr, "WrapGroup: %zu communicators but %zu backends\n", group.size(),
                 ops.size());
    std::abort();
  }
  std::vector<std::unique_ptr<comm::Communicator>> out;
  for (size_t r = 0; r < group.size(); ++r) {
    out.push_back(std::make_unique<DeviceEmulationCommunicator>(std::move(group[r]), ops[r]));
  }
  return out;
}

}  // namespace loom::engine::testing
