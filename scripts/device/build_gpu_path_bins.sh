#!/usr/bin/env bash
# Issue 8: builds, HERE (the Debian build machine, no GPU needed), the GPU
# test binaries that scripts/device/gpu_path_check.sh runs on the device
# machine. That machine has CUDA 13 and PyTorch's NCCL (nvidia-nccl-cu13) but
# no Abseil, GoogleTest or Debian packages, so everything except the C
# library, the CUDA driver and libnccl.so.2 is linked statically (Abseil and
# GoogleTest archives, libstdc++, cudart_static); libnccl.so.2 is found at
# run time through LD_LIBRARY_PATH.
#
#   scripts/device/build_gpu_path_bins.sh [OUT_DIR]   (default build-gpu/device-bin)
#
# Then: run(command="scripts/device/gpu_path_check.sh", carry=["build-gpu/device-bin"])
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-build-gpu/device-bin}
cuda=${CUDA_HOME:-/usr/local/cuda}
mkdir -p "$out"
absl=(/usr/lib/x86_64-linux-gnu/libabsl_*.a)
flags=(-std=c++20 -O2 -Wall -Wextra -Wno-unused-parameter -I. -I"$cuda/include")
libs=(-Wl,--start-group /usr/lib/x86_64-linux-gnu/libgtest_main.a /usr/lib/x86_64-linux-gnu/libgtest.a
      "${absl[@]}" -Wl,--end-group "$cuda/lib64/libcudart_static.a" -L"$cuda/lib64" -lnccl
      -ldl -lrt -lpthread -static-libstdc++ -static-libgcc)

g++ "${flags[@]}" -o "$out/gpu_nccl_communicator_test" \
  tests/gpu/nccl_communicator_test.cc worker/comm/nccl_communicator.cc worker/comm/nccl_init.cc \
  worker/comm/traffic.cc worker/comm/in_process_store.cc "${libs[@]}"
strip "$out/gpu_nccl_communicator_test"
ls -l "$out"
echo "dynamic dependencies:"; ldd "$out/gpu_nccl_communicator_test" | sed 's/^/  /'
