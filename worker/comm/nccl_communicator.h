// The Communicator over NCCL, for ranks on GPUs: the same interface and error
// contract as the Gloo one (docs/comm.md), with the data in device memory.
// Built only where CUDA and NCCL are found (LOOM_HAVE_NCCL).
//
// One NCCL communicator per group. Rank 0 of the group creates the unique id
// and publishes it in the rendezvous store under `<key_prefix>/nccl_unique_id`;
// the others read it from there. Communicators are created non-blocking, so
// that a watchdog thread can abort one (ncclCommAbort) while another thread
// is blocked in it.
//
// Streams: every operation runs on the communicator's own stream, after the
// work already issued to `compute_stream` (an event recorded there is waited
// on), between two timing events (the stream reaching it, its completion);
// Work::Wait blocks the host until the second, so the caller's later kernels
// see the result, and Work::DeviceTime is the time between them. Computation issued
// between posting an async operation and waiting for it overlaps with it.
//
// Failures: a watchdog thread polls ncclCommGetAsyncError and the oldest
// operation in flight; on an NCCL error, or an operation running longer than
// `timeout`, it aborts the communicator. The waiting call then returns
// INTERNAL/UNAVAILABLE (NCCL's error) or DEADLINE_EXCEEDED naming the group
// and the operation, and every later call fails with the first error.
//
// A Work must not outlive its communicator; destroying an unfinished Work
// waits for it (the operation still uses the caller's buffer).
//
// Send/Recv: NCCL has no tags; sends and receives between two ranks match in
// posting order (the tag is checked by nothing, as with MPI's wildcard). The
// posting versions are batched: everything posted before the first Wait (or
// before the next collective) is launched as one NCCL group, so a stage can
// post its send and its receive and then wait for both without deadlock
// (the pattern of torch.distributed.batch_isend_irecv). StartPosted launches
// the open batch at once, so that it overlaps what the caller computes before
// its Wait (a ring posts its receive and its send, starts them, then computes).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/comm/communicator.h"
#include "worker/comm/store.h"

namespace loom::comm {

struct NcclOptions {
  std::string group_name;  // "dp", "tp[0,1]": used in errors and counters
  int rank = 0;
  int size = 1;
  // Rendezvous namespace of the group in the store (unique per job attempt
  // and group instance, e.g. GroupKeyPrefix(...)).
  std::string key_prefix;
  // Bound on every operation, counted from when it is launched.
  absl::Duration timeout = absl::Seconds(300);
  // Bound on communicator creation (store wait and NCCL init); 0: timeout.
  absl::Duration rendezvous_timeout = absl::ZeroDuration();
  // CUDA device of this rank; -1: the calling thread's current device.
  int device = -1;
  // cudaStream_t the engine computes on (nullptr: the legacy default stream);
  // operations start after the work issued to it so far.
  void* compute_stream = nullptr;
  // How often the watchdog polls.
  absl::Duration watchdog_interval = absl::Milliseconds(20);
};

// Blocks until every member has joined (or rendezvous_timeout passes:
// DEADLINE_EXCEEDED naming the group). INVALID_ARGUMENT for bad options,
// FAILED_PRECONDITION when there is no CUDA device, INTERNAL/UNAVAILABLE for
// NCCL's own failures.
absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(Store& store,
                                                                      const NcclOptions& options);

// Whether this process sees a CUDA device (tests skip without one).
bool CudaDeviceAvailable();

}  // namespace loom::comm
