#include "worker/comm/gloo_communicator.h"

#include <signal.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/alltoallv.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/common/error.h"
#include "gloo/math.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/unbound_buffer.h"
#include "worker/comm/gloo_state.h"
#include "worker/comm/gloo_store_bridge.h"
#include "worker/comm/op_queue.h"
#include "worker/comm/ring_reduce_scatter.h"
#include "worker/comm/tcp_address.h"
#include "worker/comm/traffic.h"

namespace loom::comm {
namespace {

constexpr int64_t kFloatBytes = sizeof(float);

int64_t Bytes(size_t elements) { return static_cast<int64_t>(elements) * kFloatBytes; }

// Gloo wants a non-null pointer even for empty buffers.
float* NonNull(const float* ptr) {
  static float dummy = 0;
  return ptr != nullptr ? const_cast<float*>(ptr) : &dummy;
}

// A posted send or receive: the queue posts it in order, the caller's Wait
// waits for the transfer itself, so a send and a receive can be in flight at
// once.
struct Transfer {
  std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
  std::chrono::steady_clock::time_point deadline;
};

class TransferWork : public Work {
 public:
  TransferWork(std::shared_ptr<GlooState> state, std::shared_ptr<OpState> posted,
               std::shared_ptr<Transfer> transfer, std::string op, int64_t bytes)
      : state_(std::move(state)), posted_(std::move(posted)), transfer_(std::move(transfer)),
        op_(std::move(op)), bytes_(bytes) {}
  ~TransferWork() override { Wait().IgnoreError(); }

  absl::Status Wait() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (result_.has_value()) return *result_;
    // Posting never blocks on the peer; it waits only for earlier queued
    // operations, each bounded by its own timeout.
    posted_->WaitUntil(absl::InfiniteFuture());
    absl::Status status = posted_->status();
    if (status.ok()) {
      const bool is_send = op_ == "send";
      status = state_->Run(op_, [&] {
        const auto left = std::max(std::chrono::duration_cast<std::chrono::milliseconds>(
                                       transfer_->deadline - std::chrono::steady_clock::now()),
                                   std::chrono::milliseconds(1));
        if (is_send) {
          transfer_->buffer->waitSend(left);
        } else {
          transfer_->buffer->waitRecv(left);
        }
      });
      if (status.ok()) state_->Record(op_, is_send ? bytes_ : 0, bytes_);
    }
    transfer_.reset();
    result_ = status;
    return status;
  }

 private:
  std::mutex mu_;
  std::shared_ptr<GlooState> state_;
  std::shared_ptr<OpState> posted_;
  std::shared_ptr<Transfer> transfer_;
  std::string op_;
  int64_t bytes_;
  std::optional<absl::Status> result_;
};

class GlooCommunicator : public Communicator {
 public:
  explicit GlooCommunicator(std::shared_ptr<GlooState> state)
      : state_(std::move(state)), queue_(std::make_unique<OpQueue>(state_->name())) {}

  ~GlooCommunicator() override { queue_.reset(); }

  int rank() const override { return state_->rank(); }
  int size() const override { return state_->size(); }
  const std::string& name() const override { return state_->name(); }

  absl::Status AllReduce(std::span<float> data, ReduceOp op) override { return AllReduceAsync(data, op)->Wait(); }

  std::unique_ptr<Work> AllReduceAsync(std::span<float> data, ReduceOp op) override {
    return Enqueue("all_reduce", [this, data, op](uint32_t tag) {
      return Collective("all_reduce", traffic::AllReduceBytes(Bytes(data.size()), size()), Bytes(data.size()),
                        data.empty(), [&] {
                          gloo::AllreduceOptions opts(state_->context());
                          opts.setOutput(data.data(), data.size());
                          using Fn = void (*)(void*, const void*, const void*, size_t);
                          opts.setReduceFunction(op == ReduceOp::kSum ? static_cast<Fn>(&gloo::sum<float>)
                                                                      : static_cast<Fn>(&gloo::max<float>));
                          opts.setTag(tag);
                          opts.setTimeout(state_->timeout_ms());
                          gloo::allreduce(opts);
                        });
    });
  }

  absl::Status ReduceScatter(std::span<const float> in, std::span<float> out) override {
    if (in.size() != out.size() * size()) {
      return Invalid("reduce_scatter", absl::StrCat("in.size() (", in.size(), ") must equal out.size() (",
                                                    out.size(), ") times the group size (", size(), ")"));
    }
    return Enqueue("reduce_scatter", [this, in, out](uint32_t tag) {
             return Collective("reduce_scatter", traffic::ReduceScatterBytes(Bytes(in.size()), size()),
                               Bytes(in.size()), in.empty(), [&] {
                                 const auto deadline = std::chrono::steady_clock::now() + state_->timeout_ms();
                                 RingReduceScatter(*state_->context(), in.data(), out.data(), out.size(),
                                                   ReduceOp::kSum, tag, deadline);
                               });
           })
        ->Wait();
  }

  absl::Status AllGather(std::span<const float> in, std::span<float> out) override {
    if (out.size() != in.size() * size()) {
      return Invalid("all_gather", absl::StrCat("out.size() (", out.size(), ") must equal in.size() (", in.size(),
                                                ") times the group size (", size(), ")"));
    }
    return Enqueue("all_gather", [this, in, out](uint32_t tag) {
             return Collective("all_gather", traffic::AllGatherBytes(Bytes(in.size()), size()), Bytes(out.size()),
                               in.empty(), [&] {
                                 gloo::AllgatherOptions opts(state_->context());
                                 opts.setInput(NonNull(in.data()), in.size());
                                 opts.setOutput(out.data(), out.size());
                                 opts.setTag(tag);
                                 opts.setTimeout(state_->timeout_ms());
                                 gloo::allgather(opts);
                               });
           })
        ->Wait();
  }

  absl::Status Broadcast(std::span<float> data, int root) override {
    if (root < 0 || root >= size()) {
      return Invalid("broadcast", absl::StrCat("root ", root, " is outside the group [0, ", size(), ")"));
    }
    return Enqueue("broadcast", [this, data, root](uint32_t tag) {
             return Collective("broadcast", traffic::BroadcastBytes(Bytes(data.size()), size(), rank(), root),
                               Bytes(data.size()), data.empty(), [&] {
                                 gloo::BroadcastOptions opts(state_->context());
                                 opts.setOutput(data.data(), data.size());
                                 opts.setRoot(root);
                                 opts.setTag(tag);
                                 opts.setTimeout(state_->timeout_ms());
                                 gloo::broadcast(opts);
                               });
           })
        ->Wait();
  }

  absl::Status Send(std::span<const float> data, int peer, uint32_t tag) override {
    return SendAsync(data, peer, tag)->Wait();
  }
  absl::Status Recv(std::span<float> data, int peer, uint32_t tag) override {
    return RecvAsync(data, peer, tag)->Wait();
  }

  std::unique_ptr<Work> SendAsync(std::span<const float> data, int peer, uint32_t tag) override {
    return Post("send", NonNull(data.data()), data.size(), peer, tag);
  }
  std::unique_ptr<Work> RecvAsync(std::span<float> data, int peer, uint32_t tag) override {
    return Post("recv", NonNull(data.data()), data.size(), peer, tag);
  }

  absl::Status AllToAll(std::span<const float> in, const std::vector<int64_t>& send_counts, std::span<float> out,
                        const std::vector<int64_t>& recv_counts) override {
    if (absl::Status s = CheckSplits(in.size(), send_counts, out.size(), recv_counts); !s.ok()) return s;
    return Enqueue("all_to_all", [this, in, out, send_counts, recv_counts](uint32_t tag) {
             return Collective("all_to_all", traffic::AllToAllBytes(send_counts, rank(), kFloatBytes),
                               Bytes(in.size()), false, [&] {
                                 gloo::AlltoallvOptions opts(state_->context());
                                 opts.setInput(NonNull(in.data()), send_counts);
                                 opts.setOutput(NonNull(out.data()), recv_counts);
                                 opts.setTag(tag);
                                 opts.setTimeout(state_->timeout_ms());
                                 gloo::alltoallv(opts);
                               });
           })
        ->Wait();
  }

  absl::Status AllToAllInt64(std::span<const int64_t> in, std::span<int64_t> out) override {
    if (in.size() != out.size() || in.size() % size() != 0) {
      return Invalid("all_to_all_int64", absl::StrCat("in.size() (", in.size(), ") and out.size() (", out.size(),
                                                      ") must be equal and a multiple of the group size (",
                                                      size(), ")"));
    }
    const std::vector<int64_t> counts(size(), static_cast<int64_t>(in.size() / size()));
    return Enqueue("all_to_all_int64", [this, in, out, counts](uint32_t tag) {
             return Collective("all_to_all_int64",
                               traffic::AllToAllBytes(counts, rank(), static_cast<int64_t>(sizeof(int64_t))),
                               static_cast<int64_t>(in.size_bytes()), in.empty(), [&] {
                                 static int64_t dummy = 0;
                                 gloo::AlltoallvOptions opts(state_->context());
                                 opts.setInput(in.empty() ? &dummy : const_cast<int64_t*>(in.data()), counts);
                                 opts.setOutput(out.empty() ? &dummy : out.data(), counts);
                                 opts.setTag(tag);
                                 opts.setTimeout(state_->timeout_ms());
                                 gloo::alltoallv(opts);
                               });
           })
        ->Wait();
  }

  absl::Status Barrier() override {
    return Enqueue("barrier", [this](uint32_t tag) {
             return Collective("barrier", 0, 0, false, [&] {
               gloo::BarrierOptions opts(state_->context());
               opts.setTag(tag);
               opts.setTimeout(state_->timeout_ms());
               gloo::barrier(opts);
             });
           })
        ->Wait();
  }

  CommStats Stats() const override { return state_->Stats(); }

  void Abort(const std::string& reason) override {
    state_->Interrupt(absl::StatusCode::kAborted, absl::StrCat("aborted: ", reason));
  }

  CommProgress Progress() const override { return queue_->Progress(); }

 private:
  using Body = std::function<absl::Status(uint32_t tag)>;

  absl::Status Invalid(const std::string& op, const std::string& rule) const {
    return absl::InvalidArgumentError(absl::StrCat("group ", name(), ": ", op, ": ", rule));
  }

  absl::Status CheckSplits(size_t in_size, const std::vector<int64_t>& send_counts, size_t out_size,
                           const std::vector<int64_t>& recv_counts) const {
    const size_t n = size();
    if (send_counts.size() != n || recv_counts.size() != n) {
      return Invalid("all_to_all", absl::StrCat("send_counts (", send_counts.size(), ") and recv_counts (",
                                                recv_counts.size(), ") need one entry per rank (", n, ")"));
    }
    int64_t send_total = 0;
    int64_t recv_total = 0;
    for (size_t i = 0; i < n; ++i) {
      if (send_counts[i] < 0 || recv_counts[i] < 0) {
        return Invalid("all_to_all", absl::StrCat("counts must not be negative (rank ", i, ")"));
      }
      send_total += send_counts[i];
      recv_total += recv_counts[i];
    }
    if (send_total != static_cast<int64_t>(in_size) || recv_total != static_cast<int64_t>(out_size)) {
      return Invalid("all_to_all", absl::StrCat("the counts must add up to the buffers: send ", send_total,
                                                " vs in.size() ", in_size, ", recv ", recv_total,
                                                " vs out.size() ", out_size));
    }
    if (send_counts[rank()] != recv_counts[rank()]) {
      return Invalid("all_to_all", absl::StrCat("the part a rank keeps must be the same in both: send_counts[",
                                                rank(), "] = ", send_counts[rank()], ", recv_counts[", rank(),
                                                "] = ", recv_counts[rank()]));
    }
    return absl::OkStatus();
  }

  // Queues a collective. Tags advance only for collectives, which every
  // member runs in the same order, so they agree across ranks.
  std::unique_ptr<Work> Enqueue(const std::string& op, Body body) {
    auto state = queue_->Submit(op, [this, body = std::move(body)] { return body(next_tag_++); });
    const absl::Duration limit = state_->timeout() + std::max(absl::Seconds(2), state_->timeout() / 2);
    std::weak_ptr<GlooState> weak = state_;
    return std::make_unique<QueuedWork>(std::move(state), limit, [weak, timeout = state_->timeout()] {
      if (auto shared = weak.lock()) {
        shared->Interrupt(absl::StatusCode::kDeadlineExceeded,
                          absl::StrCat("timed out after ", absl::FormatDuration(timeout),
                                       " waiting for peers (the transport did not notice; stopped by Wait)"));
      }
    });
  }

  absl::Status Collective(const std::string& op, int64_t bytes, int64_t logical_bytes, bool empty,
                          const std::function<void()>& fn) {
    // Every member has the same sizes, so an empty operation is empty on all
    // of them and needs no traffic.
    absl::Status status = empty ? state_->Run(op, [] {}) : state_->Run(op, fn);
    if (status.ok()) state_->Record(op, bytes, logical_bytes);
    return status;
  }

  std::unique_ptr<Work> Post(const std::string& op, float* data, size_t elements, int peer, uint32_t tag) {
    if (peer < 0 || peer >= size() || peer == rank()) {
      return std::make_unique<DoneWork>(
          Invalid(op, absl::StrCat("peer ", peer, " must be another rank of the group [0, ", size(), ")")));
    }
    auto transfer = std::make_shared<Transfer>();
    const int64_t bytes = Bytes(elements);
    auto posted = queue_->Submit(op, [this, op, transfer, data, bytes, peer, tag] {
      return state_->Run(op, [&] {
        transfer->deadline = std::chrono::steady_clock::now() + state_->timeout_ms();
        transfer->buffer = state_->context()->createUnboundBuffer(data, bytes);
        if (op == "send") {
          transfer->buffer->send(peer, tag);
        } else {
          transfer->buffer->recv(peer, tag);
        }
      });
    });
    return std::make_unique<TransferWork>(state_, std::move(posted), std::move(transfer), op, bytes);
  }

  std::shared_ptr<GlooState> state_;
  uint32_t next_tag_ = 0;  // touched only by the queue's thread
  std::unique_ptr<OpQueue> queue_;  // last: its thread stops before the rest goes
};

void IgnoreSigpipeOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current;
    if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
      signal(SIGPIPE, SIG_IGN);
    }
  });
}

absl::Status CheckOptions(const GlooOptions& o) {
  const std::string where = absl::StrCat("gloo communicator '", o.group_name, "': ");
  if (o.group_name.empty()) return absl::InvalidArgumentError("gloo communicator: group_name must not be empty");
  if (o.size < 1) return absl::InvalidArgumentError(absl::StrCat(where, "size must be at least 1, got ", o.size));
  if (o.rank < 0 || o.rank >= o.size) {
    return absl::InvalidArgumentError(absl::StrCat(where, "rank ", o.rank, " is outside [0, ", o.size, ")"));
  }
  if (o.key_prefix.empty()) return absl::InvalidArgumentError(absl::StrCat(where, "key_prefix must not be empty"));
  if (o.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(where, "timeout must be positive"));
  }
  if (o.rendezvous_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(where, "rendezvous_timeout must not be negative"));
  }
  if (o.hostname.empty() && o.interface.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(where, "set hostname or interface to bind the TCP transport"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(Store& store, const GlooOptions& options) {
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  IgnoreSigpipeOnce();
  const std::string& group = options.group_name;
  const absl::Duration rendezvous_timeout =
      options.rendezvous_timeout == absl::ZeroDuration() ? options.timeout : options.rendezvous_timeout;

  if (absl::Status s = CheckTcpBindTarget(options.hostname, options.interface); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("group ", group, ": cannot bind the TCP transport: ", s.message()));
  }
  std::shared_ptr<gloo::transport::Device> device;
  try {
    gloo::transport::tcp::attr attr;
    if (!options.interface.empty()) {
      attr.iface = options.interface;
    } else {
      attr.hostname = options.hostname;
    }
    device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        "group ", group, ": cannot bind the TCP transport to ",
        options.interface.empty() ? absl::StrCat("hostname '", options.hostname, "'")
                                  : absl::StrCat("interface '", options.interface, "'"),
        ": ", StripGlooLocation(e.what())));
  }

  auto context = std::make_shared<AbortableGlooContext>(options.rank, options.size);
  GlooStoreBridge bridge(store, options.key_prefix, rendezvous_timeout);
  try {
    // A pair waits up to five context timeouts for its peer to connect, so a
    // fifth of the rendezvous timeout keeps the whole join within it.
    context->setTimeout(std::chrono::milliseconds(
        std::max<int64_t>(1000, absl::ToInt64Milliseconds(rendezvous_timeout) / 5)));
    context->connectFullMesh(bridge, device);
    context->setTimeout(std::chrono::milliseconds(std::max<int64_t>(1, absl::ToInt64Milliseconds(options.timeout))));
  } catch (const std::exception& e) {
    const std::string missing = bridge.missing_key();
    if (!missing.empty()) {
      return absl::DeadlineExceededError(absl::StrCat(
          "group ", group, ": rendezvous timed out after ", absl::FormatDuration(rendezvous_timeout),
          ": rank ", missing, " of ", options.size, " never published its address under '", options.key_prefix,
          "/'"));
    }
    return absl::UnavailableError(absl::StrCat("group ", group, ": rendezvous failed (rank ", options.rank, " of ",
                                               options.size, "): ", StripGlooLocation(e.what())));
  }
  auto state = std::make_shared<GlooState>(group, options.rank, options.size, options.timeout, std::move(context));
  return std::unique_ptr<Communicator>(new GlooCommunicator(std::move(state)));
}

}  // namespace loom::comm
