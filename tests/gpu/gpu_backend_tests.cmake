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

# Context parallelism's GPU path (docs/context_parallel.md): the merge and the
# ring's blocks on the device against the CPU; with two devices the ring over
# NCCL. Part of the device script's binaries (scripts/device/build_gpu_trainer.sh).
if(TARGET loom_cuda_backend AND TARGET loom_model)
  add_executable(gpu_ring_attention_test ${CMAKE_CURRENT_LIST_DIR}/cuda_ring_attention_test.cc)
  target_link_libraries(gpu_ring_attention_test PRIVATE loom_cuda_backend loom_model
    loom_kernels_cpu GTest::gtest_main)
  if(TARGET loom_comm_nccl)
    target_link_libraries(gpu_ring_attention_test PRIVATE loom_comm_nccl)
    target_compile_definitions(gpu_ring_attention_test PRIVATE LOOM_RING_TEST_HAVE_NCCL=1)
  endif()
  gtest_discover_tests(gpu_ring_attention_test DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 120)
endif()

# In-place recovery on the device (docs/fault_tolerance.md): a snapshot's
# capture and rollback through CudaOps, and an attempt's NCCL groups stopped
# by the set's abort. Part of the device script's binaries.
if(TARGET loom_cuda_backend AND TARGET loom_engine)
  add_executable(gpu_snapshot_test ${CMAKE_CURRENT_LIST_DIR}/snapshot_gpu_test.cc)
  target_link_libraries(gpu_snapshot_test PRIVATE loom_engine loom_cuda_backend CUDA::cudart
    GTest::gtest_main)
  target_include_directories(gpu_snapshot_test PRIVATE ${CMAKE_SOURCE_DIR})
  if(TARGET loom_comm_nccl)
    target_link_libraries(gpu_snapshot_test PRIVATE loom_comm_nccl)
    target_compile_definitions(gpu_snapshot_test PRIVATE LOOM_SNAPSHOT_TEST_HAVE_NCCL=1)
  endif()
  gtest_discover_tests(gpu_snapshot_test DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 120
    ENVIRONMENT "OMP_WAIT_POLICY=passive")
endif()
