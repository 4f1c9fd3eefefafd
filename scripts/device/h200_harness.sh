#!/usr/bin/env bash
# The device harness for issue 6: on a fresh Hopper machine (CUDA 13.0 and
# PyTorch there; no CMake, gRPC or Debian packages needed) it builds the CUDA
# kernels, their GPU tests and benchmarks with plain nvcc, runs the tests,
# benchmarks each kernel against its PyTorch baseline in the same run, and
# prints one table last. Bounded to 8 minutes: each step has a timeout and
# steps are skipped once the budget is nearly spent.
#
#   scripts/device/h200_harness.sh            # from the repository root
#
# Logs and JSON rows go to $OUT (the device tool's output folder) or
# /tmp/loom-device-out.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/loom-device-out}
mkdir -p "$out"
start=$(date +%s)
budget=470  # seconds; the issue allows 8 minutes
build=build-device
status=()
# (steps run in this shell, output through process substitution, so that
# their status is kept)

left() { echo $((budget - ($(date +%s) - start))); }
step() {  # step NAME TIMEOUT CMD...: runs unless too little budget is left
  local name=$1 limit=$2; shift 2
  local remaining; remaining=$(left)
  if [ "$remaining" -lt 20 ]; then status+=("$name: SKIPPED (budget)"); return; fi
  [ "$limit" -gt "$remaining" ] && limit=$remaining
  echo "=== $name (limit ${limit}s, $(( $(date +%s) - start ))s elapsed)"
  timeout "$limit" "$@"
  local rc=$?
  status+=("$name: rc=$rc")
  return $rc
}

{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv
  "${NVCC:-/usr/local/cuda/bin/nvcc}" --version | tail -2
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  command -v cmake >/dev/null && cmake --version | head -1 || echo "cmake: absent"
} 2>&1 | tee "$out/machine.txt"

step build 200 scripts/device/build_cuda.sh "$build" "$(nproc)" > >(tee "$out/build.txt") 2>&1
cp "$build/ptxas.txt" "$out/ptxas.txt" 2>/dev/null

if command -v cuobjdump >/dev/null || [ -x /usr/local/cuda/bin/cuobjdump ]; then
  cuobj=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
  # Which matrix instructions each kernel file really uses (QGMMA = fp8 wgmma,
  # HGMMA = 16-bit wgmma, HMMA = mma.sync) and any local-memory traffic.
  for o in "$build"/obj/kernels_cuda_*.o; do
    sass=$("$cuobj" --dump-sass "$o" 2>/dev/null)
    printf '%-48s QGMMA %5d HGMMA %5d HMMA %5d LDL %4d STL %4d\n' "$(basename "$o")" \
      "$(grep -c QGMMA <<<"$sass")" "$(grep -c HGMMA <<<"$sass")" "$(grep -c HMMA <<<"$sass")" \
      "$(grep -c 'LDL' <<<"$sass")" "$(grep -c 'STL' <<<"$sass")"
  done | tee "$out/sass_summary.txt"
fi

step gpu_tests 100 "$build/gpu_kernels_test" > >(tee "$out/gpu_tests.txt") 2>&1
step dev_bench 70 "$build/cuda_kernels_bench" > >(tee "$out/dev_bench.txt") 2>&1
rm -f "$out/bench.jsonl"
export PYTHONUNBUFFERED=1
step vs_torch_attention 130 python3 scripts/device/bench_vs_torch.py --lib "$build/libloom_cuda_capi.so" \
  --section attention --json "$out/bench.jsonl" > "$out/vs_torch_attention.txt" 2>&1
tail -3 "$out/vs_torch_attention.txt"
step vs_torch_fp8 70 python3 scripts/device/bench_vs_torch.py --lib "$build/libloom_cuda_capi.so" \
  --section fp8 --json "$out/bench.jsonl" > "$out/vs_torch_fp8.txt" 2>&1
tail -3 "$out/vs_torch_fp8.txt"

echo
echo "=== summary ($(( $(date +%s) - start ))s)"
printf '  %s\n' "${status[@]}"
grep -E "^\[ FAIL \]|tests passed|SKIP" "$out/gpu_tests.txt" | head -30
grep "^BENCH" "$out/dev_bench.txt" | cut -c9-
[ -s "$out/bench.jsonl" ] && python3 scripts/device/bench_vs_torch.py --table "$out/bench.jsonl" | tee "$out/table.txt"
