// Host copies of backend tensors, for the code that reads or writes tensors
// with the host (checkpoint save and load, GatherParameters). On a device
// backend a tensor's TensorView::data is device memory that the host must not
// touch; these helpers move whole tensors with the backend's Copy* ops. On the
// CPU backend the views already are host memory and nothing is copied.
#pragma once

#include <vector>

#include "kernels/ops.h"
#include "worker/engine/tensor_view.h"

namespace loom::engine {

class HostStaging {
 public:
  // Host views of `views` (same names, shapes and sharding fields). With
  // download, their contents are the backend's now; without, they are zeros
  // (for a load that will overwrite them). The backend's views must stay
  // valid until Upload.
  HostStaging(kernels::Ops& ops, const std::vector<TensorView>& views, bool download);
  HostStaging(const HostStaging&) = delete;
  HostStaging& operator=(const HostStaging&) = delete;

  // Host memory: the copies, or the originals on the CPU backend.
  const std::vector<TensorView>& host() const { return host_; }
  // Writes the host copies back into the backend's tensors (nothing to do
  // without copies).
  void Upload();

 private:
  kernels::Ops& ops_;
  std::vector<TensorView> device_;
  std::vector<TensorView> host_;
  std::vector<std::vector<float>> storage_;
};

// True when the backend's memory is the host's (no staging needed).
inline bool HostAddressable(const kernels::Ops& ops) {
  return ops.device() == kernels::DeviceType::kCpu;
}

// Appends the contents of `views` (backend memory) to *out, in order.
void DownloadTensors(kernels::Ops& ops, const std::vector<TensorView>& views,
                     std::vector<float>* out);

}  // namespace loom::engine
