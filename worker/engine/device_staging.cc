#include "worker/engine/device_staging.h"

#include <cstdint>

namespace loom::engine {

HostStaging::HostStaging(kernels::Ops& ops, const std::vector<TensorView>& views, bool download)
    : ops_(ops), device_(views) {
  if (HostAddressable(ops)) {
    host_ = views;
    device_.clear();
    return;
  }
  storage_.reserve(views.size());
  host_.reserve(views.size());
  for (const TensorView& v : views) {
    storage_.emplace_back(static_cast<size_t>(v.numel()), 0.0f);
    if (download) {
      ops.CopyDeviceToHost(storage_.back().data(), v.data,
                           v.numel() * static_cast<int64_t>(sizeof(float)));
    }
    TensorView h = v;
    h.data = storage_.back().data();
    host_.push_back(std::move(h));
  }
}

void HostStaging::Upload() {
  for (size_t i = 0; i < device_.size(); ++i) {
    ops_.CopyHostToDevice(device_[i].data, host_[i].data,
                          device_[i].numel() * static_cast<int64_t>(sizeof(float)));
  }
}

void DownloadTensors(kernels::Ops& ops, const std::vector<TensorView>& views,
                     std::vector<float>* out) {
  for (const TensorView& v : views) {
    const size_t at = out->size();
    out->resize(at + static_cast<size_t>(v.numel()));
    ops.CopyDeviceToHost(out->data() + at, v.data, v.numel() * static_cast<int64_t>(sizeof(float)));
  }
}

}  // namespace loom::engine
