#include "worker/comm/nccl_init.h"

#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"

namespace loom::comm {

std::string CudaText(cudaError_t e) {
  return absl::StrCat(cudaGetErrorName(e), ": ", cudaGetErrorString(e));
}

absl::Status NcclError(ncclResult_t r, const std::string& what, ncclComm_t comm) {
  const char* last = comm != nullptr ? ncclGetLastError(comm) : nullptr;
  std::string msg = absl::StrCat(what, ": ", ncclGetErrorString(r));
  if (last != nullptr && *last != '\0') absl::StrAppend(&msg, " (", last, ")");
  if (r == ncclSystemError || r == ncclRemoteError) return absl::UnavailableError(msg);
  return absl::InternalError(msg);
}

ncclResult_t Settle(ncclComm_t comm, ncclResult_t r, absl::Time deadline,
                    const std::atomic<bool>* aborted) {
  while (r == ncclInProgress) {
    if (absl::Now() > deadline || (aborted != nullptr && aborted->load())) return ncclInProgress;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    if (ncclCommGetAsyncError(comm, &r) != ncclSuccess) return ncclInternalError;
  }
  return r;
}

bool CudaDeviceAvailable() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

absl::StatusOr<ncclComm_t> InitNcclComm(Store& store, NcclOptions& o) {
  if (o.group_name.empty()) o.group_name = "nccl";
  const std::string& group = o.group_name;
  if (o.size < 1 || o.rank < 0 || o.rank >= o.size || o.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "group ", group, ": rank ", o.rank, " of size ", o.size, " with timeout ",
        absl::FormatDuration(o.timeout), ": need 0 <= rank < size and a positive timeout"));
  }
  if (o.rendezvous_timeout <= absl::ZeroDuration()) o.rendezvous_timeout = o.timeout;
  if (!CudaDeviceAvailable()) {
    return absl::FailedPreconditionError(
        absl::StrCat("group ", group, ": no CUDA device is visible to this process"));
  }
  if (o.device < 0) {
    if (cudaError_t e = cudaGetDevice(&o.device); e != cudaSuccess) {
      return absl::InternalError(absl::StrCat("group ", group, ": cudaGetDevice: ", CudaText(e)));
    }
  }
  if (cudaError_t e = cudaSetDevice(o.device); e != cudaSuccess) {
    return absl::InvalidArgumentError(
        absl::StrCat("group ", group, ": device ", o.device, ": ", CudaText(e)));
  }
  const absl::Time deadline = absl::Now() + o.rendezvous_timeout;
  const std::string key =
      o.key_prefix.empty() ? "nccl_unique_id" : o.key_prefix + "/nccl_unique_id";
  ncclUniqueId id;
  if (o.rank == 0) {
    if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
      return NcclError(r, absl::StrCat("group ", group, ": ncclGetUniqueId"), nullptr);
    }
    absl::Status s = store.Set(key, std::string(id.internal, sizeof(id.internal)));
    if (!s.ok()) return s;
  } else {
    absl::StatusOr<std::string> value = store.Get(key, o.rendezvous_timeout);
    if (!value.ok()) {
      return absl::Status(value.status().code(),
                          absl::StrCat("group ", group, ": rendezvous: rank 0 never published the "
                                       "NCCL id under '", key, "': ", value.status().message()));
    }
    if (value->size() != sizeof(id.internal)) {
      return absl::InternalError(absl::StrCat("group ", group, ": '", key, "' holds ",
                                              value->size(), " bytes, not an NCCL unique id (",
                                              sizeof(id.internal), ")"));
    }
    std::memcpy(id.internal, value->data(), sizeof(id.internal));
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // so that the watchdog can abort a hung call
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, o.size, id, o.rank, &config);
  if (comm != nullptr) r = Settle(comm, r, deadline, nullptr);
  if (r == ncclSuccess) return comm;
  if (comm != nullptr) ncclCommAbort(comm);
  if (r == ncclInProgress) {
    return absl::DeadlineExceededError(
        absl::StrCat("group ", group, ": NCCL init timed out after ",
                     absl::FormatDuration(o.rendezvous_timeout), ": not all ", o.size,
                     " ranks joined"));
  }
  return NcclError(r, absl::StrCat("group ", group, ": ncclCommInitRankConfig"), nullptr);
}

}  // namespace loom::comm
