// Internal to CudaOps: the cuBLASLt handle and the GEMM workspace, kept out of
// cuda_ops.h so its users need no cuBLAS headers.
#pragma once

#include <cublasLt.h>

#include <cstdint>
#include <memory>
#include <string>

#include "kernels/cuda/backend/cuda_ops.h"

namespace loom::kernels::cuda {

struct CudaOps::LtState {
  static std::unique_ptr<LtState> Create(int64_t workspace_bytes, std::string* error);
  ~LtState();

  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;  // cudaMalloc'ed, outside the caching allocator
  int64_t workspace_bytes = 0;
};

}  // namespace loom::kernels::cuda
