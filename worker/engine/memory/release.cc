#include "worker/engine/memory/release.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

namespace loom::engine {

void ReleaseToZero(kernels::Ops& ops, float* data, int64_t count) {
  if (count <= 0) return;
  if (ops.device() != kernels::DeviceType::kCpu) {
    ops.Fill(data, count, 0.0f);
    return;
  }
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  const uintptr_t end = begin + static_cast<uintptr_t>(count) * sizeof(float);
  const uintptr_t inner_begin = (begin + page - 1) / page * page;
  const uintptr_t inner_end = end / page * page;
  if (inner_end <= inner_begin ||
      madvise(reinterpret_cast<void*>(inner_begin), inner_end - inner_begin, MADV_DONTNEED) != 0) {
    std::memset(data, 0, end - begin);
    return;
  }
  std::memset(data, 0, inner_begin - begin);
  std::memset(reinterpret_cast<void*>(inner_end), 0, end - inner_end);
}

}  // namespace loom::engine
