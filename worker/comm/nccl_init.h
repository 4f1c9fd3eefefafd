// Creation of one group's NCCL communicator (unique id through the rendezvous
// store, non-blocking init bounded by the rendezvous timeout) and the small
// CUDA/NCCL error helpers the NCCL Communicator shares. Internal to
// worker/comm; built only with CUDA and NCCL.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/comm/store.h"

namespace loom::comm {

// "cudaErrorX: text".
std::string CudaText(cudaError_t e);

// NCCL's system and remote errors (a peer or the network is gone) become
// UNAVAILABLE, the rest INTERNAL; the message has `what`, NCCL's error string
// and, with a communicator, its last error text.
absl::Status NcclError(ncclResult_t r, const std::string& what, ncclComm_t comm);

// A non-blocking communicator answers ncclInProgress until a call is done:
// polls ncclCommGetAsyncError until it says something else, the deadline
// passes or *aborted turns true (then ncclInProgress is returned).
ncclResult_t Settle(ncclComm_t comm, ncclResult_t r, absl::Time deadline,
                    const std::atomic<bool>* aborted);

// Validates `o` (filling in group_name, device and rendezvous_timeout
// defaults), selects the device, exchanges the unique id through the store
// (rank 0 publishes it under "<key_prefix>/nccl_unique_id") and creates a
// non-blocking communicator. On any failure nothing is left behind.
absl::StatusOr<ncclComm_t> InitNcclComm(Store& store, NcclOptions& o);

}  // namespace loom::comm
