#include "tests/engine_device/device_emulation_communicator.h"

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace loom::engine::testing {

struct DeviceEmulationCommunicator::Held {
  bool send = false;
  std::span<float> host;
  int peer = 0;
  uint32_t tag = 0;
  int64_t batch = -1;                // set when started
  std::unique_ptr<comm::Work> work;  // the inner communicator's, once started
  bool waited = false;
};

namespace {

// The caller's handle of a held post: Wait starts the open batch first.
class HeldWork final : public comm::Work {
 public:
  HeldWork(DeviceEmulationCommunicator* comm, std::shared_ptr<DeviceEmulationCommunicator::Held> h)
      : comm_(comm), h_(std::move(h)) {}
  ~HeldWork() override { (void)Wait(); }  // the transfer still uses the caller's buffer
  absl::Status Wait() override {
    if (h_->work == nullptr) comm_->StartHeld();
    if (!h_->waited) {
      h_->waited = true;
      comm_->TraceEvent(absl::StrCat("wait ", h_->batch));
    }
    return h_->work->Wait();
  }

 private:
  DeviceEmulationCommunicator* comm_;
  std::shared_ptr<DeviceEmulationCommunicator::Held> h_;
};

}  // namespace

void DeviceEmulationCommunicator::StartHeld() {
  std::vector<std::shared_ptr<Held>> batch;
  int64_t number = 0;
  {
    std::lock_guard<std::mutex> lock(held_mu_);
    if (held_.empty()) return;
    batch.swap(held_);
    number = batches_++;
  }
  TraceEvent(absl::StrCat("start ", number));
  for (const std::shared_ptr<Held>& h : batch) {
    h->batch = number;
    h->work = h->send ? inner_->SendAsync(h->host, h->peer, h->tag)
                      : inner_->RecvAsync(h->host, h->peer, h->tag);
  }
}

void DeviceEmulationCommunicator::StartPosted() { StartHeld(); }

absl::Status DeviceEmulationCommunicator::Barrier() {
  StartHeld();
  return inner_->Barrier();
}

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
  StartHeld();  // as NCCL launches the open batch before a collective
  auto host = Host(data, "AllReduce", "data");
  ++forwarded_;
  return inner_->AllReduce(host, op);
}

std::unique_ptr<comm::Work> DeviceEmulationCommunicator::AllReduceAsync(std::span<float> data,
                                                                        comm::ReduceOp op) {
  StartHeld();  // as NCCL launches the open batch before a collective
  auto host = Host(data, "AllReduceAsync", "data");
  ++forwarded_;
  return inner_->AllReduceAsync(host, op);
}

absl::Status DeviceEmulationCommunicator::ReduceScatter(std::span<const float> in,
                                                        std::span<float> out) {
  StartHeld();  // as NCCL launches the open batch before a collective
  auto host_in = Host(in, "ReduceScatter", "in");
  auto host_out = Host(out, "ReduceScatter", "out");
  ++forwarded_;
  return inner_->ReduceScatter(host_in, host_out);
}

absl::Status DeviceEmulationCommunicator::AllGather(std::span<const float> in,
                                                    std::span<float> out) {
  StartHeld();  // as NCCL launches the open batch before a collective
  auto host_in = Host(in, "AllGather", "in");
  auto host_out = Host(out, "AllGather", "out");
  ++forwarded_;
  return inner_->AllGather(host_in, host_out);
}

absl::Status DeviceEmulationCommunicator::Broadcast(std::span<float> data, int root) {
  StartHeld();  // as NCCL launches the open batch before a collective
  auto host = Host(data, "Broadcast", "data");
  ++forwarded_;
  return inner_->Broadcast(host, root);
}

std::unique_ptr<comm::Work> DeviceEmulationCommunicator::Hold(bool send, std::span<float> host,
                                                              int peer, uint32_t tag) {
  ++forwarded_;
  auto h = std::make_shared<Held>();
  h->send = send;
  h->host = host;
  h->peer = peer;
  h->tag = tag;
  std::lock_guard<std::mutex> lock(held_mu_);
  held_.push_back(h);
  return std::make_unique<HeldWork>(this, h);
}

// Blocking point-to-point is post + wait, as in the NCCL communicator.
absl::Status DeviceEmulationCommunicator::Send(std::span<const float> data, int peer,
                                               uint32_t tag) {
  auto host = Host(data, "Send", "data");
  return Hold(true, {const_cast<float*>(host.data()), host.size()}, peer, tag)->Wait();
}

absl::Status DeviceEmulationCommunicator::Recv(std::span<float> data, int peer, uint32_t tag) {
  return Hold(false, Host(data, "Recv", "data"), peer, tag)->Wait();
}

std::unique_ptr<comm::Work> DeviceEmulationCommunicator::SendAsync(std::span<const float> data,
                                                                   int peer, uint32_t tag) {
  auto host = Host(data, "SendAsync", "data");
  return Hold(true, {const_cast<float*>(host.data()), host.size()}, peer, tag);
}

std::unique_ptr<comm::Work> DeviceEmulationCommunicator::RecvAsync(std::span<float> data,
                                                                   int peer, uint32_t tag) {
  return Hold(false, Host(data, "RecvAsync", "data"), peer, tag);
}

absl::Status DeviceEmulationCommunicator::AllToAll(std::span<const float> in,
                                                   const std::vector<int64_t>& send_counts,
                                                   std::span<float> out,
                                                   const std::vector<int64_t>& recv_counts) {
  StartHeld();  // as NCCL launches the open batch before a collective
  auto host_in = Host(in, "AllToAll", "in");
  auto host_out = Host(out, "AllToAll", "out");
  ++forwarded_;
  return inner_->AllToAll(host_in, send_counts, host_out, recv_counts);
}

absl::Status DeviceEmulationCommunicator::AllToAllInt64(std::span<const int64_t> in,
                                                        std::span<int64_t> out) {
  StartHeld();  // as NCCL launches the open batch before a collective
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
