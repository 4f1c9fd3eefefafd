#!/usr/bin/env bash
# The one prepared device run of issues 8 and 31: everything GPU in Loom,
# checked, then timed, in one call on the device machine (one H200; CUDA 13
# driver, PyTorch 2.11 with the nvidia cu13 wheels; no Abseil, yaml-cpp,
# OpenBLAS or Debian packages). It runs the binaries that
# scripts/device/build_gpu_trainer.sh built HERE (carried, packed, in
# build-gpu/device-bin) and takes at most BUDGET_S seconds (default 500).
# Correctness comes first and the FIRST WRONG NUMBER STOPS THE RUN (exit 1,
# with the failing lines last), so a fix can be tried again within the
# device budget; the timings follow only when every check passed.
#
#   0. the machine (nvidia-smi, torch), libnccl.so.2 and libcublasLt.so.13
#      found in the venv's nvidia wheels or /usr/local/cuda (LD_LIBRARY_PATH);
#   1. checks, each against a reference:
#      gpu_kernels_test (the CUDA kernels against the std-only references:
#      attention forward/backward, FP8 quantization and GEMMs, RMSNorm, RoPE,
#      SwiGLU, cross-entropy, AdamW, and the MoE routing, permutation,
#      combine and router backward), cuda_ops_test (CudaOps against CpuOps,
#      op by op, the MoE ops included), gpu_nccl_communicator_test,
#      gpu_ring_attention_test (context parallelism: the LSE merge and the
#      ring's blocks on the device; the NCCL ring itself needs two devices and
#      skips on one), gpu_snapshot_test (in-place recovery: a snapshot
#      captured from and rolled back into CudaOps, byte-identical images, the
#      steps after the rollback against the first pass; an attempt's NCCL
#      groups stopped by the abort; the blocked-collective case needs two
#      devices and skips on one);
#      (a) the small model (jobs/small_*.yaml: vocab 256 bytes of a synthetic
#      corpus made here, hidden 256, 2 layers) for 20 steps on the CPU in fp32
#      and on the GPU in bf16 (and fp32, and CPU bf16 emulation, for context):
#      per-step losses compared by compare_losses.py, PASS/FAIL; (a') the same
#      with mixture-of-experts FFNs (jobs/small_moe_*.yaml: routing and row
#      movement on the device), PASS/FAIL;
#   2. speed, side by side in the same run: cuda_kernels_bench (every kernel
#      and variant, the MoE ones included) and, with libloom_cuda_capi.so,
#      bench_vs_torch.py (attention against SDPA, FP8 block-scaled GEMM
#      against cuBLASLt bf16 through torch); (b) a ~1B Llama
#      (jobs/llama1b_gpu_*.yaml; synthetic llm.c tokens made here) for 20
#      steps in bf16 and in fp8 by loom-trainer, and (c) PyTorch's own step
#      for the same model and batch (torch_llama_step.py: SDPA, bf16
#      autocast, fused AdamW); tokens/s and MFU for each, MFU from the shared
#      peak table (loom-device-peaks) and the trainer's FLOP formula, in one
#      table.
#
# Here:    scripts/device/build_gpu_trainer.sh
# Device:  run(command="bash scripts/device/gpu_train_check.sh", carry=["build-gpu/device-bin"],
#              timeout_s=560)
# Writes to $OUT: machine.txt tests.log small.log kernels.log torch.log
# llama1b.log results.jsonl summary.txt (8 files: the tool returns at most 8).
# The last lines printed are the summary.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/loom-device-out}
packed=${BINS:-build-gpu/device-bin}
work=${WORK:-/tmp/loom-gpu-train}
bins=$work/bin
py=${PYTHON:-python3}
budget=${BUDGET_S:-500}
big_steps=${BIG_STEPS:-20}
start=$(date +%s)
mkdir -p "$out"
rm -rf "$work"
mkdir -p "$work/small" "$work/big" "$work/bin"
summary=()

note() { echo "$*"; summary+=("$*"); }
# The summary, printed last and kept in $OUT (at the end, or at the first
# wrong number).
finish() {
  {
    echo "=== gpu_train_check.sh on '${gpu_name:-?}' after $(elapsed)s"
    printf '%s\n' "${summary[@]}"
    if [ -s "$out/results.jsonl" ]; then
      echo "--- ~1B Llama (hidden 2048, 16 layers, 16/8 heads, ffn 5632, vocab 32000, seq 2048, 16 seq/step):"
      $py scripts/device/train_report.py table "$out/results.jsonl"
    fi
  } > "$out/summary.txt" 2>&1
  cat "$out/summary.txt"
}
# stop_at_wrong_number WHAT LOG: a check failed. Nothing after it is worth
# the device time until it is fixed: say so loudly, show its failing lines,
# and end the run with status 1.
stop_at_wrong_number() {
  note "FIRST WRONG NUMBER: $1 (log: $(basename "$2")); the run stops here"
  summary+=("--- failing lines of $(basename "$2"):")
  while IFS= read -r line; do summary+=("  $line"); done < <(
    grep -E "FAIL|Failure|failed|Expected|Which is|differ|rel err|error|Error|SKIP" "$2" | tail -25)
  finish
  echo "######## STOPPED AT THE FIRST WRONG NUMBER: $1 ########"
  exit 1
}
elapsed() { echo $(( $(date +%s) - start )); }
left() { echo $(( budget - $(elapsed) )); }
# run_step NAME LIMIT LOG CMD...: runs CMD under a timeout cut to the budget
# left, appending its output to LOG; its exit status (124: timed out; 125:
# skipped for want of budget).
run_step() {
  local name=$1 limit=$2 log=$3; shift 3
  local remaining; remaining=$(left)
  if [ "$remaining" -lt 15 ]; then
    echo "=== $name: SKIPPED (budget spent)" | tee -a "$log"
    return 125
  fi
  [ "$limit" -gt "$remaining" ] && limit=$remaining
  echo "=== $name (limit ${limit}s, at $(elapsed)s)" | tee -a "$log"
  timeout -k 5 "$limit" "$@" >> "$log" 2>&1
  local rc=$?
  echo "=== $name: rc=$rc after $(elapsed)s" | tee -a "$log"
  return $rc
}

# --- 0. The machine and the libraries -------------------------------------
{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.limit \
    --format=csv 2>&1
  $py -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'gpu', torch.cuda.get_device_name() if torch.cuda.is_available() else None, 'nccl', torch.cuda.nccl.version() if torch.cuda.is_available() else None)" 2>&1
  echo "cpus: $(nproc); $(grep -s PRETTY_NAME /etc/os-release); $(ldd --version 2>&1 | head -1)"
  echo "(the binaries need glibc >= 2.36: arc4random from the static libstdc++)"
} > "$out/machine.txt" 2>&1
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
# The binaries travel packed (build_gpu_trainer.sh: NAME.xz and SHA256SUMS).
if ! scripts/device/unpack_bins.sh "$packed" "$bins" >> "$out/machine.txt" 2>&1; then
  echo "unpacking $packed failed (see machine.txt)" | tee -a "$out/machine.txt"
fi
cat "$out/machine.txt"

libdirs=$($py - <<'PY'
import glob, os, site, sys
roots = []
try:
    roots += site.getsitepackages()
except Exception:
    pass
roots += glob.glob(os.path.join(sys.prefix, "lib*", "python3*", "site-packages"))
roots += ["/opt/torch/.venv"]
found = {}
for want in ("libnccl.so.2", "libcublasLt.so.13"):
    for root in [os.path.join(r, "nvidia") for r in roots] + ["/opt/torch/.venv"]:
        hits = sorted(glob.glob(os.path.join(root, "**", want), recursive=True))
        if hits:
            found[want] = os.path.dirname(hits[0])
            break
    else:
        for d in ("/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib",
                  "/usr/local/cuda/lib"):
            if os.path.exists(os.path.join(d, want)):
                found[want] = d
                break
for want in ("libnccl.so.2", "libcublasLt.so.13"):
    print(want, found.get(want, "NOT-FOUND"))
PY
)
nccl_dir=$(echo "$libdirs" | awk '$1=="libnccl.so.2"{print $2}')
cublas_dir=$(echo "$libdirs" | awk '$1=="libcublasLt.so.13"{print $2}')
for d in "$nccl_dir" "$cublas_dir"; do
  [ -n "$d" ] && [ "$d" != NOT-FOUND ] && LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
export LD_LIBRARY_PATH
{
  echo "libnccl.so.2 from: $nccl_dir"
  echo "libcublasLt.so.13 from: $cublas_dir"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  for b in "$bins"/*; do
    [ -f "$b" ] || continue
    echo "ldd $(basename "$b"):"; ldd "$b" 2>&1 | sed 's/^/  /'
  done
} >> "$out/machine.txt" 2>&1
tail -n +1 "$out/machine.txt" | grep -E "from:|not found" || true

if [ ! -x "$bins/loom-trainer" ]; then
  note "MISSING $packed/loom-trainer.xz: run scripts/device/build_gpu_trainer.sh here and carry build-gpu/device-bin"
  printf '%s\n' "${summary[@]}" > "$out/summary.txt"
  exit 2
fi
trainer=$bins/loom-trainer
peaks=$bins/loom-device-peaks
# loom-device-peaks exits 1 for a device not in the table, 2 (printing
# "none") for a dtype it has no units for: no MFU then.
bf16_peak=$("$peaks" "$gpu_name" bf16 2>/dev/null) || bf16_peak=0
fp8_peak=$("$peaks" "$gpu_name" fp8 2>/dev/null) || fp8_peak=0
note "device '$gpu_name': dense peaks from the table bf16 $bf16_peak, fp8 $fp8_peak FLOP/s (0: not in the table)"

# --- 1. Checks: the GPU tests, then the small models CPU vs GPU ------------
# gpu_kernels_test (std-only runner) prints "N of M GPU tests passed"; the
# GoogleTest binaries "[  PASSED  ] N tests" or "[  FAILED  ] ...". A binary
# that runs nothing for want of a device (SKIP, or 0 tests passed) would hide
# everything: that is a failure here, where the device is the point.
# The kernels' test, bench and C entry points travel prebuilt when their
# libraries allowed it (build_gpu_trainer.sh); else plain nvcc builds them here.
if [ ! -x "$bins/gpu_kernels_test" ] || [ ! -x "$bins/cuda_kernels_bench" ] ||
   [ ! -f "$bins/libloom_cuda_capi.so" ]; then
  run_step "build_cuda.sh (plain nvcc: what $packed lacks)" 240 "$out/tests.log" \
    scripts/device/build_cuda.sh "$work/cuda" "$(nproc)"
  for f in gpu_kernels_test cuda_kernels_bench libloom_cuda_capi.so; do
    [ -e "$bins/$f" ] || cp "$work/cuda/$f" "$bins/" 2>/dev/null || true
  done
fi
for t in gpu_kernels_test cuda_ops_test gpu_nccl_communicator_test gpu_ring_attention_test \
         gpu_snapshot_test; do
  if [ ! -x "$bins/$t" ]; then
    note "$t: not built (missing from $packed)"
    stop_at_wrong_number "$t missing: rebuild with scripts/device/build_gpu_trainer.sh" "$out/machine.txt"
  fi
  NCCL_DEBUG=${NCCL_DEBUG:-WARN} run_step "$t" 150 "$out/tests.log" "$bins/$t"
  rc=$?
  section=$(sed -n "/=== $t (/,/=== $t: rc/p" "$out/tests.log")
  note "$t: rc=$rc $(grep -E '^\[  (PASSED|FAILED|SKIPPED)  *\] [0-9]+ test|GPU tests passed' <<< "$section" |
    sed 's/, listed below://' | tr '\n' ' ')"
  if [ $rc != 0 ]; then
    stop_at_wrong_number "$t (rc=$rc)" "$out/tests.log"
  elif grep -q -E '^SKIP: |^\[  PASSED  \] 0 tests' <<< "$section"; then
    # (on one GPU the multi-GPU cases skip by design; nothing passing is the failure)
    stop_at_wrong_number "$t skipped its device tests on the device" "$out/tests.log"
  fi
done

# (a) and (a'): the small models, CPU fp32 against GPU bf16.
$py scripts/device/make_train_data.py text --out "$work/small/corpus.txt" --bytes 400000
backends=""
for j in small_cpu_fp32 small_gpu_bf16 small_moe_cpu_fp32 small_moe_gpu_bf16 small_gpu_fp32 \
         small_cpu_bf16; do
  $py scripts/device/make_train_data.py job --template "scripts/device/jobs/$j.yaml" \
    --out "$work/small/$j.yaml" --data "$work/small/corpus.txt"
  run_step "$j" 90 "$out/small.log" bash -c \
    "exec '$trainer' --standalone '$work/small/$j.yaml' --work_dir '$work/small' \
       --progress_format=jsonl > '$work/small/$j.jsonl'"
  rc=$?
  cat "$work/small/$j.jsonl" >> "$out/small.log" 2>/dev/null
  [ $rc = 0 ] || note "$j: loom-trainer failed, rc=$rc (see small.log)"
  # Which Ops backend the run used ("loom-trainer: training on the cuda backend").
  backends+="$j=$(sed -n "/=== $j (/,/=== $j: rc/p" "$out/small.log" |
    grep -o 'training on the [a-z0-9-]* backend' | awk '{print $4}' | head -1) "
done
note "backends: $backends"
compare() {  # compare REF TEST LABEL
  if [ -s "$work/small/$1.jsonl" ] && [ -s "$work/small/$2.jsonl" ]; then
    $py scripts/device/compare_losses.py "$work/small/$1.jsonl" "$work/small/$2.jsonl" --label "$3" \
      >> "$out/small.log" 2>&1
    local rc=$?
    note "$(tail -1 "$out/small.log")"
    return $rc
  fi
  note "FAIL $3: a run left no progress"
  return 1
}
compare small_cpu_fp32 small_gpu_bf16 "(a) GPU bf16 vs CPU fp32" ||
  stop_at_wrong_number "(a) the small model, GPU bf16 vs CPU fp32" "$out/small.log"
compare small_moe_cpu_fp32 small_moe_gpu_bf16 "(a') MoE: GPU bf16 vs CPU fp32" ||
  stop_at_wrong_number "(a') the small MoE model, GPU bf16 vs CPU fp32" "$out/small.log"
compare small_cpu_fp32 small_gpu_fp32 "GPU fp32 (bf16 attention) vs CPU fp32 [context]"
compare small_cpu_bf16 small_gpu_bf16 "GPU bf16 vs CPU bf16 emulation [context]"

# --- 2. Speed: every kernel, the kernels against PyTorch --------------------
if [ -x "$bins/cuda_kernels_bench" ]; then
  run_step cuda_kernels_bench 90 "$out/kernels.log" "$bins/cuda_kernels_bench"
  note "cuda_kernels_bench: rc=$? ($(grep -c '^BENCH' "$out/kernels.log") rows in kernels.log)"
else
  note "cuda_kernels_bench: not built (missing from $packed)"
fi
if [ -f "$bins/libloom_cuda_capi.so" ]; then
  rm -f "$work/bench.jsonl"
  for section in attention fp8; do
    PYTHONUNBUFFERED=1 run_step "bench_vs_torch $section" 120 "$out/kernels.log" \
      $py scripts/device/bench_vs_torch.py --lib "$bins/libloom_cuda_capi.so" --section "$section" \
      --json "$work/bench.jsonl"
    note "bench_vs_torch $section: rc=$?"
  done
  if [ -s "$work/bench.jsonl" ]; then
    $py scripts/device/bench_vs_torch.py --table "$work/bench.jsonl" > "$work/bench_table.txt" 2>&1
    cat "$work/bench_table.txt" >> "$out/kernels.log"
    while IFS= read -r line; do summary+=("  $line"); done < "$work/bench_table.txt"
  fi
else
  note "bench_vs_torch: libloom_cuda_capi.so not in $packed; kernels vs PyTorch not run"
fi

# --- 3. (b)+(c) the ~1B Llama: PyTorch's step, then loom-trainer bf16, fp8 --
$py scripts/device/make_train_data.py bin --out "$work/big/tokens.bin" --tokens 4000000 --vocab 32000
: > "$out/results.jsonl"
PYTHONUNBUFFERED=1 run_step "torch_llama_step (bf16 autocast, SDPA, fused AdamW)" 150 "$out/torch.log" \
  $py scripts/device/torch_llama_step.py --device cuda --peak "$bf16_peak" --steps "$big_steps" \
  --warmup 3 --json "$work/big/torch.json"
if [ -s "$work/big/torch.json" ]; then
  cat "$work/big/torch.json" >> "$out/results.jsonl"
else
  echo '{"impl": "pytorch", "label": "pytorch", "precision": "bf16", "error": "no result (see torch.log)"}' >> "$out/results.jsonl"
fi
for prec in bf16 fp8; do
  j=llama1b_gpu_$prec
  $py scripts/device/make_train_data.py job --template "scripts/device/jobs/$j.yaml" \
    --out "$work/big/$j.yaml" --data "$work/big/tokens.bin" --steps "$big_steps"
  run_step "loom-trainer $j" 180 "$out/llama1b.log" bash -c \
    "exec '$trainer' --standalone '$work/big/$j.yaml' --work_dir '$work/big' \
       --progress_format=jsonl > '$work/big/$j.jsonl'"
  rc=$?
  cat "$work/big/$j.jsonl" >> "$out/llama1b.log" 2>/dev/null
  peak=$bf16_peak; [ "$prec" = fp8 ] && peak=$fp8_peak
  $py scripts/device/train_report.py throughput "$work/big/$j.jsonl" --label "loom-$prec" \
    --precision "$prec" --peak "$peak" --bf16-peak "$bf16_peak" >> "$out/results.jsonl"
  [ $rc = 0 ] || note "loom-trainer $j: rc=$rc (see llama1b.log)"
done

finish
exit 0
