#include "worker/engine/tensor_parallel/tp_collectives.h"

#include <span>

namespace loom::engine {

const float* TpCollectives::GatherRows(const float* rows, int64_t local_floats, float* full) {
  if (!sp_) return rows;
  AllGather(rows, local_floats, full);
  return full;
}

void TpCollectives::ReduceRows(float* partial, int64_t full_floats, float* out) {
  if (!status_.ok()) return;
  ops_->Synchronize();  // collectives read backend memory the ops may still be writing
  if (sp_) {
    Keep(comm_->ReduceScatter(
        std::span<const float>(partial, static_cast<size_t>(full_floats)),
        std::span<float>(out, static_cast<size_t>(full_floats / size()))));
    return;
  }
  Keep(comm_->AllReduce(std::span<float>(partial, static_cast<size_t>(full_floats))));
  if (out != partial) {
    ops_->CopyDeviceToDevice(out, partial, full_floats * static_cast<int64_t>(sizeof(float)));
  }
}

void TpCollectives::AllReduce(float* data, int64_t n) {
  if (!status_.ok() || n == 0) return;
  ops_->Synchronize();
  Keep(comm_->AllReduce(std::span<float>(data, static_cast<size_t>(n))));
}

void TpCollectives::AllGather(const float* in, int64_t n, float* out) {
  if (!status_.ok()) return;
  ops_->Synchronize();
  Keep(comm_->AllGather(std::span<const float>(in, static_cast<size_t>(n)),
                        std::span<float>(out, static_cast<size_t>(n * size()))));
}

}  // namespace loom::engine
