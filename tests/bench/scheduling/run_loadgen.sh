#!/usr/bin/env bash
# The scheduling policies at scale through a real coordinator (issue 27):
# loom-loadgen --jobs against a fresh loom-coordinator (default flags, mutual
# TLS): 256 labelled fake nodes of 8 GPUs, 1,000 jobs of mixed sizes and
# priorities from 10 users, two under quotas, each running 10-40 fake steps
# of 0.1 s. Prints loadgen's measurements and RESULT line (decisions per
# second, a device's time from free to its next rank, waits, and whether every
# rule held). A benchmark, not a test: it takes the machine for minutes.
# docs/scale.md records its results.
#
#   tests/bench/scheduling/run_loadgen.sh [--build=DIR] [--nodes=256] [--jobs=1000]
#                                         [--out=DIR] [-- extra coordinator flags]
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
build="$root/build"
nodes=256
jobs=1000
out=""
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build=*) build="${1#*=}" ;;
    --nodes=*) nodes="${1#*=}" ;;
    --jobs=*) jobs="${1#*=}" ;;
    --out=*) out="${1#*=}" ;;
    --) shift; extra=("$@"); break ;;
    *) echo "usage: $0 [--build=DIR] [--nodes=N] [--jobs=N] [--out=DIR] [-- coordinator flags]" >&2; exit 2 ;;
  esac
  shift
done
bin="$build/bin"
for b in loom-coordinator loom-loadgen; do
  [ -x "$bin/$b" ] || { echo "run_loadgen.sh: $bin/$b missing (cmake --build $build --target $b)" >&2; exit 2; }
done
work="$(mktemp -d /tmp/loom-sched-XXXXXX)"
out="${out:-$work}"
mkdir -p "$out"
"$root/scripts/make_certs.sh" "$work/certs" > /dev/null
mkdir -p "$work/data/data"
echo "loom" > "$work/data/data/train.txt"
ulimit -n 20000 2>/dev/null || true

coordinator=""
cleanup() {
  [ -n "$coordinator" ] && kill "$coordinator" 2>/dev/null || true
}
trap cleanup EXIT

echo "# $(date -u '+%Y-%m-%d %H:%M UTC') $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg)"
port=$(( 29000 + RANDOM % 2000 ))
"$bin/loom-coordinator" --listen="127.0.0.1:$port" --metrics_listen= --state_dir="$work/state" \
  --tls_dir="$work/certs/coordinator" --data_roots="$work/data" --preemption=false "${extra[@]}" \
  > "$out/coordinator.log" 2>&1 &
coordinator=$!
sleep 1
status=0
"$bin/loom-loadgen" --coordinator="127.0.0.1:$port" --ca_dir="$work/certs/ca" \
  --nodes="$nodes" --gpus_per_node=8 --jobs="$jobs" --coordinator_pid="$coordinator" \
  > "$out/loadgen.log" 2>&1 || status=$?
kill "$coordinator" 2>/dev/null || true
wait "$coordinator" 2>/dev/null || true
coordinator=""
grep -vE '^ended: ' "$out/loadgen.log" | tail -25
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg); loadgen exit $status; logs in $out"
exit "$status"
