#!/usr/bin/env bash
# Builds the CUDA kernels, their GPU tests and benchmarks with plain nvcc and
# nothing beyond CUDA and the C++ standard library (no CMake, no GoogleTest):
# what a fresh device machine has. Also works on a build machine without a
# GPU (compile only).
#
#   scripts/device/build_cuda.sh [BUILD_DIR] [JOBS]
#
# Outputs in BUILD_DIR (default build-device): gpu_kernels_test,
# cuda_kernels_bench, libloom_cuda_capi.so, and ptxas.txt (registers, spills).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-build-device}
jobs=${2:-$(nproc)}
nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
[ -x "$nvcc" ] || nvcc=$(command -v nvcc)
mkdir -p "$out/obj"
flags=(-std=c++17 -O3 --use_fast_math -lineinfo --expt-relaxed-constexpr
       -gencode=arch=compute_90a,code=sm_90a -Xcompiler -fPIC -I.)

lib_sources=(kernels/cuda/attention/attention_fwd.cu kernels/cuda/attention/attention_bwd.cu
             kernels/cuda/fp8/fp8_quant.cu kernels/cuda/fp8/fp8_gemm.cu kernels/cuda/fp8/fp8_gemm_mma.cu
             kernels/cuda/fp8/fp8_gemm_wgmma.cu kernels/cuda/ops/rmsnorm.cu kernels/cuda/ops/rope.cu
             kernels/cuda/ops/swiglu.cu kernels/cuda/ops/cross_entropy.cu kernels/cuda/ops/adamw.cu
             kernels/cuda/ops/moe.cu)
test_sources=(tests/gpu/gpu_test_main.cu tests/gpu/attention_test.cu tests/gpu/fp8_test.cu
              tests/gpu/fused_ops_test.cu tests/gpu/moe_ops_test.cu)
bench_sources=(tests/bench/cuda/cuda_kernels_bench.cu)
all=("${lib_sources[@]}" "${test_sources[@]}" "${bench_sources[@]}" kernels/cuda/capi.cu)

obj_of() { echo "$out/obj/$(echo "$1" | tr '/' '_' | sed 's/\.cu$/.o/')"; }
export -f obj_of
export out nvcc
printf '%s\n' "${all[@]}" | xargs -P "$jobs" -I{} bash -c \
  'o=$(obj_of {}); "$nvcc" '"${flags[*]}"' -Xptxas -v -c {} -o "$o" > "$o.log" 2>&1 || { cat "$o.log"; exit 255; }'
cat "$out"/obj/*.log | grep -E "Compiling entry|registers|spill" > "$out/ptxas.txt" || true
if grep -E "[1-9][0-9]* bytes spill" "$out/ptxas.txt" >/dev/null; then
  echo "note: some kernels spill registers (see $out/ptxas.txt)"
fi

lib_objs=(); for s in "${lib_sources[@]}"; do lib_objs+=("$(obj_of "$s")"); done
test_objs=(); for s in "${test_sources[@]}"; do test_objs+=("$(obj_of "$s")"); done
"$nvcc" -gencode=arch=compute_90a,code=sm_90a "${test_objs[@]}" "${lib_objs[@]}" -o "$out/gpu_kernels_test"
"$nvcc" -gencode=arch=compute_90a,code=sm_90a "$(obj_of "${bench_sources[0]}")" "${lib_objs[@]}" -o "$out/cuda_kernels_bench"
"$nvcc" -gencode=arch=compute_90a,code=sm_90a -shared "$(obj_of kernels/cuda/capi.cu)" "${lib_objs[@]}" \
  -o "$out/libloom_cuda_capi.so"
echo "built: $out/gpu_kernels_test $out/cuda_kernels_bench $out/libloom_cuda_capi.so"
