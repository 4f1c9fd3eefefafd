#!/usr/bin/env bash
# Issue 8: the GPU test binaries for scripts/device/gpu_path_check.sh. Folded
# into scripts/device/build_gpu_trainer.sh, which builds them (and the GPU
# trainer) with CMake from the real targets, statically linked except glibc,
# libcuda, libcublasLt.so.13 and libnccl.so.2, and packs them as
# build-gpu/device-bin/NAME.xz. Kept so that older notes keep working.
#   scripts/device/build_gpu_path_bins.sh [OUT_DIR]   (default build-gpu/device-bin)
exec "$(dirname "$0")/build_gpu_trainer.sh" "$@"
