#!/bin/bash
# Loom's CPU training step against PyTorch's, side by side, on the same model
# (~10M parameters: vocab 256, hidden 384, 6 layers, 6 heads / 2 kv heads,
# ffn 1024), batch, sequence and thread count. Runs the two alternately
# ROUNDS times (so background load hits both alike) and prints each JSON line,
# then the medians (wall and process CPU time), the ratio, and the fraction of the machine's sgemm rate a
# Loom step reaches.
#
# usage: tests/bench/engine_step/run.sh [BUILD_DIR] [THREADS] [ROUNDS]
#   BUILD_DIR defaults to build (needs target engine_step_bench built),
#   THREADS to the number of online CPUs, ROUNDS to 3.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:-build}"
threads="${2:-$(nproc)}"
rounds="${3:-3}"
bench="$build/bin/engine_step_bench"
[[ -x "$bench" ]] || { echo "run.sh: $bench not found; build target engine_step_bench first" >&2; exit 2; }

# Both processes get the same thread count for OpenMP and for OpenBLAS (which
# PyTorch calls for its GEMMs; torch.set_num_threads does not reach it).
export OMP_NUM_THREADS="$threads" OPENBLAS_NUM_THREADS="$threads"
echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) $(lscpu | sed -n 's/^Model name: *//p') threads=$threads" \
     "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset} loadavg=$(cut -d' ' -f1-3 /proc/loadavg)"
out=$(mktemp)
for ((r = 0; r < rounds; r++)); do
  "$bench" --threads="$threads" --steps=5 | tee -a "$out"
  /usr/bin/python3 "$here/torch_step.py" --threads "$threads" --steps 5 | tee -a "$out"
done
/usr/bin/python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
loom = [r for r in rows if r["impl"] == "loom"]
torch = [r for r in rows if r["impl"] == "torch"]
lm = statistics.median(r["step_ms"] for r in loom)
tm = statistics.median(r["step_ms"] for r in torch)
lc = statistics.median(r["cpu_ms"] for r in loom)
tc = statistics.median(r["cpu_ms"] for r in torch)
frac = statistics.median(r["fraction_of_sgemm"] for r in loom)
sg = statistics.median(r["sgemm_gflops"] for r in loom)
print(f"loom step {lm:.1f} ms, torch step {tm:.1f} ms, loom/torch = {lm / tm:.3f}; "
      f"loom reaches {frac:.2f} of sgemm ({sg:.1f} GFLOP/s); "
      f"process CPU time per step: loom {lc:.1f} ms, torch {tc:.1f} ms ({lc / tc:.3f})")
PY
rm -f "$out"
