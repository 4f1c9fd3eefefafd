#include "worker/comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/comm/nccl_init.h"
#include "worker/comm/traffic.h"

namespace loom::comm {
namespace {

constexpr int64_t kFloatBytes = static_cast<int64_t>(sizeof(float));
int64_t Bytes(size_t n) { return static_cast<int64_t>(n) * kFloatBytes; }

// A launched operation, or a batch of posted sends and receives.
struct Pending {
  struct Record {
    std::string op;
    int64_t bytes, logical_bytes;
  };
  struct Transfer {
    bool send;
    float* data;
    size_t count;
    int peer;
  };
  std::string op;
  std::vector<Record> records;      // counters added on success
  std::vector<Transfer> transfers;  // point-to-point batches only
  bool launched = false;            // guarded by launch_mu_
  absl::Time start;
  // Timing events around the operation on the group's stream: started when
  // the stream reaches it (the caller's earlier kernels done), done at its end.
  cudaEvent_t started = nullptr;
  cudaEvent_t done = nullptr;
  std::optional<absl::Duration> device_time;  // guarded by mu_; set when finished OK
  bool finished = false;  // guarded by mu_
  absl::Status status;    // guarded by mu_
};

class NcclCommunicator;

class NcclWork : public Work {
 public:
  NcclWork(NcclCommunicator* comm, std::shared_ptr<Pending> p) : comm_(comm), p_(std::move(p)) {}
  ~NcclWork() override { (void)Wait(); }  // the operation still uses the caller's buffer
  absl::Status Wait() override;
  std::optional<absl::Duration> DeviceTime() const override;

 private:
  NcclCommunicator* comm_;
  std::shared_ptr<Pending> p_;
};

// The device time of the last synchronous call of each thread, and on which
// group (Communicator::LastDeviceTime).
struct LastSync {
  const void* group = nullptr;
  std::optional<absl::Duration> device_time;
};
thread_local LastSync last_sync_;

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(const NcclOptions& o, ncclComm_t comm, cudaStream_t stream, cudaEvent_t ready,
                   float* scratch)
      : name_(o.group_name),
        rank_(o.rank),
        size_(o.size),
        timeout_(o.timeout),
        interval_(o.watchdog_interval),
        device_(o.device),
        compute_(static_cast<cudaStream_t>(o.compute_stream)),
        stream_(stream),
        ready_(ready),
        scratch_(scratch),
        comm_(comm) {
    watchdog_ = std::thread([this] { WatchdogLoop(); });
  }

  ~NcclCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    wake_.notify_all();
    watchdog_.join();
    cudaSetDevice(device_);
    if (!aborted_.exchange(true)) {
      // Finalize flushes what is in flight; peers that are gone would keep
      // it from ever finishing, so it is bounded and falls back to abort.
      ncclResult_t r = Settle(comm_, ncclCommFinalize(comm_), absl::Now() + timeout_, nullptr);
      if (r == ncclSuccess) {
        ncclCommDestroy(comm_);
      } else {
        ncclCommAbort(comm_);
      }
    }
    for (auto& p : in_flight_) {
      cudaEventDestroy(p->done);
      if (p->started != nullptr) cudaEventDestroy(p->started);
    }
    for (auto& p : aborted_in_flight_) {
      cudaEventDestroy(p->done);
      if (p->started != nullptr) cudaEventDestroy(p->started);
    }
    cudaFree(scratch_);
    cudaEventDestroy(ready_);
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }

  absl::Status AllReduce(std::span<float> data, ReduceOp op) override {
    return WaitSync(AllReduceAsync(data, op));
  }
  std::unique_ptr<Work> AllReduceAsync(std::span<float> data, ReduceOp op) override {
    const ncclRedOp_t red = op == ReduceOp::kMax ? ncclMax : ncclSum;
    return Launch("all_reduce", traffic::AllReduceBytes(Bytes(data.size()), size_),
                  Bytes(data.size()), data.empty(), [&] {
                    return ncclAllReduce(data.data(), data.data(), data.size(), ncclFloat, red,
                                         comm_, stream_);
                  });
  }
  absl::Status ReduceScatter(std::span<const float> in, std::span<float> out) override {
    if (in.size() != out.size() * static_cast<size_t>(size_)) {
      return Invalid("reduce_scatter",
                     absl::StrCat("in.size() (", in.size(), ") must equal out.size() (", out.size(),
                                  ") times the group size (", size_, ")"));
    }
    return WaitSync(Launch("reduce_scatter", traffic::ReduceScatterBytes(Bytes(in.size()), size_),
                  Bytes(in.size()), in.empty(),
                  [&] {
                    return ncclReduceScatter(in.data(), out.data(), out.size(), ncclFloat, ncclSum,
                                             comm_, stream_);
                  })
        );
  }
  absl::Status AllGather(std::span<const float> in, std::span<float> out) override {
    if (out.size() != in.size() * static_cast<size_t>(size_)) {
      return Invalid("all_gather",
                     absl::StrCat("out.size() (", out.size(), ") must equal in.size() (", in.size(),
                                  ") times the group size (", size_, ")"));
    }
    return WaitSync(Launch("all_gather", traffic::AllGatherBytes(Bytes(in.size()), size_), Bytes(out.size()),
                  in.empty(),
                  [&] {
                    return ncclAllGather(in.data(), out.data(), in.size(), ncclFloat, comm_,
                                         stream_);
                  })
        );
  }
  absl::Status Broadcast(std::span<float> data, int root) override {
    if (root < 0 || root >= size_) {
      return Invalid("broadcast",
                     absl::StrCat("root ", root, " is not a rank of the group of ", size_));
    }
    return WaitSync(Launch("broadcast", traffic::BroadcastBytes(Bytes(data.size()), size_, rank_, root),
                  Bytes(data.size()), data.empty(),
                  [&] {
                    return ncclBroadcast(data.data(), data.data(), data.size(), ncclFloat, root,
                                         comm_, stream_);
                  })
        );
  }
  absl::Status Send(std::span<const float> data, int peer, uint32_t tag) override {
    return WaitSync(SendAsync(data, peer, tag));
  }
  absl::Status Recv(std::span<float> data, int peer, uint32_t tag) override {
    return WaitSync(RecvAsync(data, peer, tag));
  }
  std::unique_ptr<Work> SendAsync(std::span<const float> data, int peer, uint32_t tag) override {
    return Post(true, const_cast<float*>(data.data()), data.size(), peer);
  }
  std::unique_ptr<Work> RecvAsync(std::span<float> data, int peer, uint32_t tag) override {
    return Post(false, data.data(), data.size(), peer);
  }
  void StartPosted() override {
    std::lock_guard<std::mutex> lock(launch_mu_);
    FlushLocked();
  }
  std::optional<absl::Duration> DeviceTimeOf(const Pending& p) const {
    std::lock_guard<std::mutex> lock(mu_);
    return p.finished && p.status.ok() ? p.device_time : std::nullopt;
  }
  std::optional<absl::Duration> LastDeviceTime() const override {
    return last_sync_.group == this ? last_sync_.device_time : std::nullopt;
  }
  absl::Status AllToAll(std::span<const float> in, const std::vector<int64_t>& send_counts,
                        std::span<float> out, const std::vector<int64_t>& recv_counts) override;
  absl::Status AllToAllInt64(std::span<const int64_t> in, std::span<int64_t> out) override;
  absl::Status Barrier() override {
    return WaitSync(Launch("barrier", 0, 0, false,
                  [&] {
                    return ncclAllReduce(scratch_, scratch_, 1, ncclFloat, ncclSum, comm_, stream_);
                  })
        );
  }

  CommStats Stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  CommProgress Progress() const override {
    std::lock_guard<std::mutex> lock(mu_);
    CommProgress p;
    p.issued = issued_;
    p.completed = completed_;
    if (!in_flight_.empty()) {
      p.current_op = in_flight_.front()->op;
      p.current_since = in_flight_.front()->start;
    }
    return p;
  }
  void Abort(const std::string& reason) override {
    std::string op;
    {
      std::lock_guard<std::mutex> lock(mu_);
      op = in_flight_.empty() ? "communicator" : in_flight_.front()->op;
    }
    Fail(absl::AbortedError(absl::StrCat("group ", name_, ": ", op, " aborted: ", reason)));
  }

  // Blocks until p is done or the communicator failed.
  absl::Status WaitFor(const std::shared_ptr<Pending>& p);

 private:
  absl::Status Invalid(const std::string& op, const std::string& rule) const {
    return absl::InvalidArgumentError(absl::StrCat("group ", name_, ": ", op, ": ", rule));
  }
  absl::Status FailedEarlier(const std::string& op) const {  // mu_ held
    return absl::Status(failure_.code(), absl::StrCat("group ", name_, ": ", op,
                                                      " not run: the communicator failed earlier: ",
                                                      failure_.message()));
  }

  template <typename Body>
  std::unique_ptr<Work> Launch(const std::string& op, int64_t bytes, int64_t logical, bool empty,
                               Body body) {
    auto p = std::make_shared<Pending>();
    p->op = op;
    p->records.push_back({op, bytes, logical});
    std::lock_guard<std::mutex> lock(launch_mu_);
    FlushLocked();
    if (empty) {  // every member has the same sizes: nothing to exchange
      std::lock_guard<std::mutex> l(mu_);
      p->launched = p->finished = true;
      p->status = failed_ ? FailedEarlier(op) : absl::OkStatus();
      if (p->status.ok()) Count(*p);
      return std::make_unique<NcclWork>(this, p);
    }
    LaunchLocked(p, body);
    return std::make_unique<NcclWork>(this, p);
  }

  std::unique_ptr<Work> Post(bool send, float* data, size_t count, int peer) {
    const std::string op = send ? "send" : "recv";
    if (peer < 0 || peer >= size_ || peer == rank_) {
      return std::make_unique<DoneWork>(Invalid(
          op, absl::StrCat("peer ", peer, " must be another rank of the group of ", size_)));
    }
    std::lock_guard<std::mutex> lock(launch_mu_);
    if (batch_ == nullptr) {
      batch_ = std::make_shared<Pending>();
      batch_->op = "send_recv";
    }
    batch_->records.push_back({op, send ? Bytes(count) : 0, Bytes(count)});
    if (count > 0) batch_->transfers.push_back({send, data, count, peer});
    return std::make_unique<NcclWork>(this, batch_);
  }

 private:
  friend class NcclWork;
  // Launches the open batch of posted transfers, if any. launch_mu_ held.
  void FlushLocked() {
    if (batch_ == nullptr) return;
    std::shared_ptr<Pending> b = std::move(batch_);
    batch_ = nullptr;
    LaunchLocked(b, [&] {
      ncclGroupStart();
      for (const Pending::Transfer& t : b->transfers) {
        if (t.send) {
          ncclSend(t.data, t.count, ncclFloat, t.peer, comm_, stream_);
        } else {
          ncclRecv(t.data, t.count, ncclFloat, t.peer, comm_, stream_);
        }
      }
      return ncclGroupEnd();
    });
  }
  std::mutex launch_mu_;  // serializes launches: every rank's NCCL calls in one order

  // Enqueues body() on the communication stream after the compute stream's
  // work so far, and records the completion event. launch_mu_ held.
  template <typename Body>
  void LaunchLocked(const std::shared_ptr<Pending>& p, Body body) {
    p->launched = true;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (failed_) {
        p->finished = true;
        p->status = FailedEarlier(p->op);
        return;
      }
      ++issued_;
    }
    absl::Status status;
    cudaSetDevice(device_);
    cudaError_t e = cudaEventRecord(ready_, compute_);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(stream_, ready_, 0);
    if (e == cudaSuccess) e = cudaEventCreate(&p->started);
    if (e == cudaSuccess) e = cudaEventRecord(p->started, stream_);
    if (e != cudaSuccess)
      status = absl::InternalError(absl::StrCat("group ", name_, ": ", p->op, ": ", CudaText(e)));
    if (status.ok()) {
      const ncclResult_t r = Settle(comm_, body(), absl::Now() + timeout_, &aborted_);
      if (r == ncclInProgress) {
        status = absl::DeadlineExceededError(absl::StrCat("group ", name_, ": ", p->op,
                                                          " could not be enqueued within ",
                                                          absl::FormatDuration(timeout_)));
      } else if (r != ncclSuccess) {
        status = NcclError(r, absl::StrCat("group ", name_, ": ", p->op, " failed"), comm_);
      }
    }
    if (status.ok()) {
      e = cudaEventCreate(&p->done);  // timed: DeviceTime
      if (e == cudaSuccess) e = cudaEventRecord(p->done, stream_);
      if (e != cudaSuccess)
        status = absl::InternalError(absl::StrCat("group ", name_, ": ", p->op, ": ", CudaText(e)));
    }
    p->start = absl::Now();
    if (!status.ok()) {
      // Never in flight: its events are this call's to free.
      if (p->started != nullptr) cudaEventDestroy(p->started);
      if (p->done != nullptr) cudaEventDestroy(p->done);
      p->started = p->done = nullptr;
      Fail(status);
      std::lock_guard<std::mutex> lock(mu_);
      p->finished = true;
      p->status = failure_;  // the first failure: an abort may have caused this one
      ++completed_;
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    in_flight_.push_back(p);
  }

  // A synchronous call: waits for its operation and keeps its device time
  // for LastDeviceTime.
  absl::Status WaitSync(std::unique_ptr<Work> work) {
    absl::Status status = work->Wait();
    last_sync_ = {this, status.ok() ? work->DeviceTime() : std::nullopt};
    return status;
  }

  void Count(const Pending& p) {  // mu_ held
    for (const Pending::Record& r : p.records) {
      OpCounters& c = stats_[r.op];
      c.calls += 1;
      c.bytes += r.bytes;
      c.logical_bytes += r.logical_bytes;
    }
  }

  // Retires the finished operations at the front of the queue (the stream
  // completes them in order). mu_ held.
  void RetireLocked() {
    while (!in_flight_.empty() && !failed_) {
      const std::shared_ptr<Pending>& p = in_flight_.front();
      const cudaError_t e = cudaEventQuery(p->done);
      if (e == cudaErrorNotReady) return;
      p->finished = true;
      ++completed_;
      if (e == cudaSuccess) {
        p->status = absl::OkStatus();
        float ms = 0;
        if (p->started != nullptr && cudaEventElapsedTime(&ms, p->started, p->done) == cudaSuccess) {
          p->device_time = absl::Microseconds(static_cast<int64_t>(ms * 1000.0f));
        }
        Count(*p);
      } else {
        p->status =
            absl::InternalError(absl::StrCat("group ", name_, ": ", p->op, ": ", CudaText(e)));
        pending_failure_ = p->status;
      }
      cudaEventDestroy(p->done);
      p->done = nullptr;
      if (p->started != nullptr) cudaEventDestroy(p->started);
      p->started = nullptr;
      in_flight_.pop_front();
    }
  }

  // Records the first failure, fails what is in flight, aborts NCCL (from
  // whichever thread gets here first; ncclCommAbort is safe while another
  // thread is blocked in the non-blocking communicator).
  void Fail(const absl::Status& status) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!failed_) {
        failure_ = status;
        failed_ = true;
      }
      for (auto& p : in_flight_) {
        p->finished = true;
        p->status = failure_;
        ++completed_;
        // The event is left to the destructor: the stream may still use it.
      }
      aborted_in_flight_.insert(aborted_in_flight_.end(), in_flight_.begin(), in_flight_.end());
      in_flight_.clear();
    }
    wake_.notify_all();
    if (!aborted_.exchange(true)) {
      cudaSetDevice(device_);
      ncclCommAbort(comm_);
    }
  }

  void WatchdogLoop();

  const std::string name_;
  const int rank_, size_;
  const absl::Duration timeout_, interval_;
  const int device_;
  cudaStream_t compute_, stream_;
  cudaEvent_t ready_;
  float* scratch_;
  ncclComm_t comm_;
  std::atomic<bool> aborted_{false};
  std::shared_ptr<Pending> batch_;  // open point-to-point batch; launch_mu_

  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Pending>> in_flight_;
  std::vector<std::shared_ptr<Pending>> aborted_in_flight_;
  CommStats stats_;
  int64_t issued_ = 0, completed_ = 0;
  bool failed_ = false;
  absl::Status failure_;
  absl::Status pending_failure_;  // a CUDA error seen while retiring
  bool stopping_ = false;
  std::thread watchdog_;
};

absl::Status NcclWork::Wait() {
  if (!p_->launched) {
    std::lock_guard<std::mutex> lock(comm_->launch_mu_);
    if (!p_->launched) comm_->FlushLocked();
  }
  return comm_->WaitFor(p_);
}

std::optional<absl::Duration> NcclWork::DeviceTime() const { return comm_->DeviceTimeOf(*p_); }

absl::Status NcclCommunicator::WaitFor(const std::shared_ptr<Pending>& p) {
  // The watchdog enforces the timeout; this bound only guards against a
  // watchdog that cannot run.
  const absl::Time give_up = absl::Now() + timeout_ + std::max(absl::Seconds(2), timeout_ / 2);
  int64_t sleep_us = 20;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      RetireLocked();
      if (!pending_failure_.ok() && !failed_) {
        lock.unlock();
        Fail(pending_failure_);
        lock.lock();
      }
      if (p->finished) return p->status;
      if (failed_) return failure_;
    }
    if (absl::Now() > give_up) {
      Fail(absl::DeadlineExceededError(
          absl::StrCat("group ", name_, ": ", p->op, " timed out after ",
                       absl::FormatDuration(timeout_), " (the watchdog did not stop it)")));
      continue;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
    sleep_us = std::min<int64_t>(sleep_us * 2, 1000);
  }
}

void NcclCommunicator::WatchdogLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    wake_.wait_for(lock, absl::ToChronoMilliseconds(interval_));
    if (stopping_ || failed_) continue;
    RetireLocked();
    absl::Status failure = pending_failure_;
    if (failure.ok() && !in_flight_.empty()) {
      const Pending& front = *in_flight_.front();
      if (absl::Now() - front.start > timeout_) {
        failure = absl::DeadlineExceededError(absl::StrCat(
            "group ", name_, ": ", front.op, " timed out after ", absl::FormatDuration(timeout_),
            " waiting for peers (", issued_ - completed_, " operations in flight)"));
      }
    }
    if (failure.ok() && !aborted_) {
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        const std::string op = in_flight_.empty() ? "communicator" : in_flight_.front()->op;
        failure = NcclError(async, absl::StrCat("group ", name_, ": ", op, " failed"), comm_);
      }
    }
    if (!failure.ok()) {
      lock.unlock();
      Fail(failure);
      lock.lock();
    }
  }
}

absl::Status NcclCommunicator::AllToAll(std::span<const float> in,
                                        const std::vector<int64_t>& send_counts,
                                        std::span<float> out,
                                        const std::vector<int64_t>& recv_counts) {
  const size_t n = static_cast<size_t>(size_);
  int64_t send_total = 0, recv_total = 0;
  bool negative = false;
  for (int64_t c : send_counts) send_total += c, negative |= c < 0;
  for (int64_t c : recv_counts) recv_total += c, negative |= c < 0;
  if (send_counts.size() != n || recv_counts.size() != n || negative ||
      send_total != static_cast<int64_t>(in.size()) ||
      recv_total != static_cast<int64_t>(out.size())) {
    return Invalid("all_to_all", absl::StrCat("send_counts and recv_counts need ", n,
                                              " non-negative entries summing to in.size() (",
                                              in.size(), ") and out.size() (", out.size(), ")"));
  }
  return WaitSync(Launch("all_to_all", traffic::AllToAllBytes(send_counts, rank_, kFloatBytes),
                Bytes(in.size()), false,
                [&] {
                  ncclGroupStart();
                  int64_t send_off = 0, recv_off = 0;
                  for (size_t peer = 0; peer < n; ++peer) {
                    if (send_counts[peer] > 0) {
                      ncclSend(in.data() + send_off, send_counts[peer], ncclFloat,
                               static_cast<int>(peer), comm_, stream_);
                    }
                    if (recv_counts[peer] > 0) {
                      ncclRecv(out.data() + recv_off, recv_counts[peer], ncclFloat,
                               static_cast<int>(peer), comm_, stream_);
                    }
                    send_off += send_counts[peer];
                    recv_off += recv_counts[peer];
                  }
                  return ncclGroupEnd();
                })
      );
}

absl::Status NcclCommunicator::AllToAllInt64(std::span<const int64_t> in, std::span<int64_t> out) {
  const size_t n = static_cast<size_t>(size_);
  if (in.size() != out.size() || in.size() % n != 0) {
    return Invalid("all_to_all_int64",
                   absl::StrCat("in.size() (", in.size(), ") and out.size() (", out.size(),
                                ") must be equal and a multiple of the group size (", n, ")"));
  }
  const size_t chunk = in.size() / n;
  const std::vector<int64_t> counts(n, static_cast<int64_t>(chunk));
  return WaitSync(Launch("all_to_all_int64",
                traffic::AllToAllBytes(counts, rank_, static_cast<int64_t>(sizeof(int64_t))),
                static_cast<int64_t>(in.size_bytes()), in.empty(),
                [&] {
                  ncclGroupStart();
                  for (size_t peer = 0; peer < n; ++peer) {
                    ncclSend(in.data() + peer * chunk, chunk, ncclInt64, static_cast<int>(peer), comm_,
                             stream_);
                    ncclRecv(out.data() + peer * chunk, chunk, ncclInt64, static_cast<int>(peer), comm_,
                             stream_);
                  }
                  return ncclGroupEnd();
                })
      );
}

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(Store& store,
                                                                     const NcclOptions& options) {
  NcclOptions o = options;
  absl::StatusOr<ncclComm_t> comm = InitNcclComm(store, o);
  if (!comm.ok()) return comm.status();
  cudaStream_t stream = nullptr;
  cudaEvent_t ready = nullptr;
  float* scratch = nullptr;
  cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&ready, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaMalloc(&scratch, sizeof(float));
  if (e != cudaSuccess) {
    ncclCommAbort(*comm);
    return absl::ResourceExhaustedError(
        absl::StrCat("group ", o.group_name, ": stream/event/buffer: ", CudaText(e)));
  }
  return std::unique_ptr<Communicator>(new NcclCommunicator(o, *comm, stream, ready, scratch));
}

}  // namespace loom::comm
