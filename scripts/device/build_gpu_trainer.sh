#!/usr/bin/env bash
# Issue 8: builds, HERE (the Debian build machine; no GPU needed), the GPU
# trainer and the GPU test binaries that scripts/device/gpu_train_check.sh
# runs on the device machine. That machine has glibc, the CUDA driver and the
# PyTorch wheels (libcublasLt.so.13, libnccl.so.2) but no Abseil, yaml-cpp,
# OpenBLAS, libgomp or GoogleTest, so everything else is linked statically.
#
#   scripts/device/build_gpu_trainer.sh [OUT_DIR]     (default build-gpu/device-bin)
#
# It is the normal CMake build of the real targets (loom-trainer,
# cuda_ops_test, gpu_nccl_communicator_test, gpu_ring_attention_test,
# gpu_snapshot_test, gpu_kernels_test, cuda_kernels_bench and the kernels' C
# entry points libloom_cuda_capi.so for bench_vs_torch.py) in its own build directory
# (BUILD_DIR, default build-gpustatic), configured with -DLOOM_WITH_GRPC=OFF
# (the trainer's standalone mode alone), -DLOOM_NATIVE=OFF (the device's CPU
# is not this one) and scripts/device/static_link.cmake as
# CMAKE_PROJECT_INCLUDE (static Abseil, yaml-cpp, OpenBLAS, libgomp,
# libstdc++/libgcc, cudart_static). Other builds are untouched.
#
# Checks: every binary's direct dependencies (readelf NEEDED) are within
# glibc, libcublasLt.so.13 and libnccl.so.2 (libcuda is opened by cudart at
# run time); `loom-trainer --help` runs; and a 6-step CPU standalone job
# trains with the built binary (its CpuOps path; the loss must fall).
# JOBS (default 2) bounds the parallel compile.
#
# OUT_DIR receives each binary stripped and xz-compressed (NAME.xz: about 3 MB
# for the trainer instead of 31, most of it the static OpenBLAS) and a
# SHA256SUMS of the uncompressed files; scripts/device/unpack_bins.sh restores
# them on the device. The uncompressed, stripped binaries stay in
# BUILD_DIR/device-bin.
#
# Then: run(command="scripts/device/gpu_train_check.sh", carry=["build-gpu/device-bin"], ...)
# (docs/gpu.md, "Left to run on a device").
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
out=${1:-build-gpu/device-bin}
build=${BUILD_DIR:-build-gpustatic}
jobs=${JOBS:-2}

mkdir -p "$build"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOOM_WITH_GRPC=OFF \
  -DLOOM_NATIVE=OFF -DLOOM_BUILD_TESTS=ON \
  -DCMAKE_PROJECT_INCLUDE="$root/scripts/device/static_link.cmake" > "$build/configure.log" 2>&1 ||
  { cat "$build/configure.log"; exit 1; }
grep -E "Loom:" "$build/configure.log" || true

targets=(loom-trainer loom-device-peaks)
for t in cuda_ops_test gpu_nccl_communicator_test gpu_ring_attention_test gpu_snapshot_test \
         gpu_kernels_test cuda_kernels_bench loom_cuda_capi; do
  if ninja -C "$build" -t query "$t" > /dev/null 2>&1; then
    targets+=("$t")
  else
    echo "note: target $t is not defined in this build (no CUDA or NCCL found?); skipped"
  fi
done
ninja -C "$build" -j"$jobs" "${targets[@]}"

raw=$build/device-bin
mkdir -p "$out" "$raw"
# Only the packed files travel: drop earlier uncompressed copies too.
for t in "${targets[@]}" libloom_cuda_capi.so; do rm -f "$out/$t" "$out/$t.xz"; done
rm -f "$out/SHA256SUMS"
allowed='^(libc\.so\.6|libm\.so\.6|libdl\.so\.2|libpthread\.so\.0|librt\.so\.1|ld-linux-x86-64\.so\.2|libcuda\.so\.1|libcublasLt\.so\.13|libnccl\.so\.2)$'
bad=0
# The C entry points are a shared library that Python loads (ctypes): it
# may need the C++ runtime, which every image with PyTorch has.
allowed_so='^(libstdc\+\+\.so\.6|libgcc_s\.so\.1)$'
files=()
for t in "${targets[@]}"; do
  f=$t
  if [ "$t" = loom_cuda_capi ]; then
    f=libloom_cuda_capi.so
    src=$(find "$build" -name "$f" -type f | head -1)
  else
    src=$build/bin/$t
  fi
  files+=("$f")
  cp "$src" "$raw/$f"
  strip "$raw/$f"
  needed=$(readelf -d "$raw/$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  xz -T1 -6 -c "$raw/$f" > "$out/$f.xz"
  echo "$f: $(du -h "$raw/$f" | cut -f1) ($(du -h "$out/$f.xz" | cut -f1) as .xz), needs: $(echo $needed)"
  for lib in $needed; do
    if [ "$t" = loom_cuda_capi ] && [[ $lib =~ $allowed_so ]]; then continue; fi
    if ! [[ $lib =~ $allowed ]]; then
      echo "  NOT ALLOWED on the device machine: $lib"
      case $t in
        # The kernels' own test, bench and C entry points: the device run
        # builds what it lacks of them with plain nvcc instead (slower).
        gpu_kernels_test|cuda_kernels_bench|loom_cuda_capi)
          echo "  $f left out of $out"; rm -f "$out/$f.xz"; unset 'files[-1]'; break ;;
        *) bad=1 ;;
      esac
    fi
  done
done
(cd "$raw" && sha256sum "${files[@]}") > "$out/SHA256SUMS"
[ "$bad" = 0 ] || { echo "FAIL: a binary needs a library the device machine lacks"; exit 1; }
du -sh "$out"

# The trainer runs here: usage, and a few CPU steps of a tiny job.
# (from the .xz files, as the device will)
check=$(mktemp -d)
scripts/device/unpack_bins.sh "$out" "$check"
usage=$("$check/loom-trainer" --help 2>&1 || true)
grep -q -- "--standalone" <<< "$usage" || { echo "FAIL: loom-trainer --help: $usage"; exit 1; }
[ "$("$check/loom-device-peaks" "NVIDIA H200" bf16)" = 9.895e+14 ]
smoke=$(mktemp -d)
/usr/bin/python3 scripts/device/make_train_data.py text --out "$smoke/corpus.txt" --bytes 200000
/usr/bin/python3 scripts/device/make_train_data.py job --template scripts/device/jobs/small_cpu_fp32.yaml \
  --out "$smoke/job.yaml" --data "$smoke/corpus.txt" --steps 6
"$check/loom-trainer" --standalone "$smoke/job.yaml" --work_dir "$smoke" --progress_format=jsonl \
  > "$smoke/progress.jsonl"
/usr/bin/python3 - "$smoke/progress.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
losses = [r["loss"] for r in rows]
print("CPU smoke run of the built loom-trainer: losses", " ".join(f"{x:.3f}" for x in losses))
assert len(rows) == 6, f"expected 6 steps, got {len(rows)}"
assert losses[-1] < losses[0], "loss did not fall"
PY
rm -rf "$smoke" "$check"
echo "built: ${targets[*]} in $out"
