#!/usr/bin/env bash
# The coordinator at scale: runs loom-loadgen against a fresh loom-coordinator
# (default flags, mutual TLS) at each rank count and prints loadgen's RESULT
# lines. A benchmark, not a test: it takes the whole machine for minutes.
# docs/scale.md records its results and how to read them.
#
#   tests/bench/scale/run.sh [--build=DIR] [--ranks=1024,4096,16384] [--run_s=30]
#                            [--spread_s=S] [--fail=crash,node] [--expect_in_place]
#                            [--perf] [--out=DIR] [-- extra coordinator flags]
# --spread_s: ranks start their rendezvous at random within S seconds of
# their launch (loom-loadgen --rank_start_spread_s; default 0: one burst).
# --fail: instead of the hang of one rank, after the steady window one rank
# crashes (crash) or one node is lost with its ranks (node; one spare node
# registers too), each kind a run of its own at each size, and loadgen
# measures the recovery: from the coordinator's declaration to every rank
# past its next step, the coordinator's CPU and the messages meanwhile
# (loom-loadgen --fail_rank, --fail). --expect_in_place: such a run is
# wrong unless the job recovers in place.
# --perf: records `perf record -g` of the coordinator during each run into
# OUT/perf-RANKS.data (Debian's linux-perf); with --fail, only the recovery
# (from the failure until every rank is past its next step), into
# OUT/perf-RANKS-KIND.data.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
build="$root/build"
sizes="1024,4096,16384"
run_s=30
spread_s=0
perf=0
out=""
fails=""
expect_in_place=0
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build=*) build="${1#*=}" ;;
    --ranks=*) sizes="${1#*=}" ;;
    --run_s=*) run_s="${1#*=}" ;;
    --spread_s=*) spread_s="${1#*=}" ;;
    --perf) perf=1 ;;
    --fail=*) fails="${1#*=}" ;;
    --expect_in_place) expect_in_place=1 ;;
    --out=*) out="${1#*=}" ;;
    --) shift; extra=("$@"); break ;;
    *) echo "usage: $0 [--build=DIR] [--ranks=N,...] [--run_s=S] [--spread_s=S] [--fail=crash,node] [--expect_in_place] [--perf] [--out=DIR] [-- coordinator flags]" >&2; exit 2 ;;
  esac
  shift
done
bin="$build/bin"
for b in loom-coordinator loom-loadgen loomctl; do
  [ -x "$bin/$b" ] || { echo "run.sh: $bin/$b missing (cmake --build $build --target $b)" >&2; exit 2; }
done
work="$(mktemp -d /tmp/loom-scale-XXXXXX)"
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
IFS=, read -ra counts <<< "$sizes"
IFS=, read -ra kinds <<< "${fails:-hang}"
for ranks in "${counts[@]}"; do
  for kind in "${kinds[@]}"; do
    case "$kind" in hang|crash|node) ;; *) echo "run.sh: --fail=$kind: crash or node" >&2; exit 2 ;; esac
    nodes=$(( ranks / 8 ))
    port=$(( 27000 + RANDOM % 2000 ))
    name="$ranks"
    [ "$kind" = hang ] || name="$ranks-$kind"
    state="$work/state-$name"
    "$bin/loom-coordinator" --listen="127.0.0.1:$port" --metrics_listen= --state_dir="$state" \
      --tls_dir="$work/certs/coordinator" --data_roots="$work/data" "${extra[@]}" \
      > "$out/coordinator-$name.log" 2>&1 &
    coordinator=$!
    sleep 1
    perf_pid=""
    fault=(--stop_rank=$(( ranks / 2 + 3 )))
    if [ "$kind" != hang ]; then
      fault=(--fail_rank=$(( ranks / 2 + 3 )) --fail="$kind")
      [ "$kind" = node ] && fault+=(--spare_nodes=1)
      [ "$expect_in_place" = 1 ] && fault+=(--expect_in_place)
      [ "$perf" = 1 ] && fault+=(--perf_recovery="$out/perf-$name.data")
    elif [ "$perf" = 1 ]; then
      perf record -g -F 499 -p "$coordinator" -o "$out/perf-$name.data" > /dev/null 2>&1 &
      perf_pid=$!
    fi
    "$bin/loom-loadgen" --coordinator="127.0.0.1:$port" --ca_dir="$work/certs/ca" \
      --nodes="$nodes" --gpus_per_node=8 --run_s="$run_s" "${fault[@]}" \
      --rank_start_spread_s="$spread_s" \
      --coordinator_pid="$coordinator" > "$out/loadgen-$name.log" 2>&1 || true
    [ -n "$perf_pid" ] && { kill -INT "$perf_pid" 2>/dev/null || true; wait "$perf_pid" 2>/dev/null || true; }
    kill "$coordinator" 2>/dev/null || true
    wait "$coordinator" 2>/dev/null || true
    coordinator=""
    grep -E '^(RESULT|FAIL|OK)' "$out/loadgen-$name.log" || tail -5 "$out/loadgen-$name.log"
    echo "# load after $name: $(cut -d' ' -f1-3 /proc/loadavg)"
  done
done
echo "# logs in $out"
