# GPU tests of issue 8's pieces (so far the NCCL Communicator): GoogleTest
# binaries that skip (GTEST_SKIP, with the reason) where there is no CUDA
# device. Included from tests/gpu/CMakeLists.txt:
#   include(${CMAKE_CURRENT_SOURCE_DIR}/gpu_backend_tests.cmake)
if(TARGET loom_comm_nccl)
  add_executable(gpu_nccl_communicator_test
    ${CMAKE_CURRENT_LIST_DIR}/nccl_communicator_test.cc)
  target_link_libraries(gpu_nccl_communicator_test PRIVATE loom_comm_nccl CUDA::cudart
    GTest::gtest_main)
  gtest_discover_tests(gpu_nccl_communicator_test DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 120)
endif()

# CudaOps (kernels/cuda/backend) against CpuOps, op by op, and its precision
# recipes against their CPU emulations; the caching allocator's tests run
# everywhere, the device ones skip without a GPU.
if(TARGET loom_cuda_backend)
  add_executable(cuda_ops_test ${CMAKE_CURRENT_LIST_DIR}/cuda_ops_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/cuda_ops_recipes_test.cc)
  target_link_libraries(cuda_ops_test PRIVATE loom_cuda_backend loom_kernels_cpu
    loom_kernels_fp8_emulation GTest::gtest_main)
  gtest_discover_tests(cuda_ops_test DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 120)
endif()
