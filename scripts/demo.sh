#!/usr/bin/env bash
# Loom's main job on one machine: builds everything, starts a coordinator and a
# node agent with two CPU ranks on loopback, submits a ~10M-parameter Llama
# that trains data-parallel on the license texts under /usr/share/common-licenses,
# watches it to the end, and stops every process it started.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
./scripts/build.sh
bin=$root/build/bin
run=$root/demo-run
rm -rf "$run"
mkdir -p "$run/state" "$run/worker" "$run/data"

# Data: every license text, the last 10% held out for validation.
cat /usr/share/common-licenses/* > "$run/data/all.txt"
total=$(stat -c %s "$run/data/all.txt")
train=$((total * 9 / 10))
head -c "$train" "$run/data/all.txt" > "$run/data/train.txt"
tail -c +"$((train + 1))" "$run/data/all.txt" > "$run/data/val.txt"
cp examples/demo.yaml "$run/job.yaml"

free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port)
metrics_port=$(free_port)
address=127.0.0.1:$port

# Mutual TLS, as in production: a development CA and the coordinator's, the
# node's and the admin's certificates (docs/security.md).
./scripts/make_certs.sh "$run/certs" --node=demo-node > /dev/null
certs=$run/certs
ctl() { "$bin/loomctl" --coordinator="$address" --tls_dir="$certs/admin" "$@"; }

pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

"$bin/loom-coordinator" --listen="$address" --metrics_listen="127.0.0.1:$metrics_port" \
  --state_dir="$run/state" --tls_dir="$certs/coordinator" > "$run/coordinator.log" 2>&1 &
pids+=($!)
"$bin/loom-worker" --coordinator="$address" --devices=cpu:2 --work_dir="$run/worker" \
  --tls_dir="$certs/node-demo-node" > "$run/worker.log" 2>&1 &
pids+=($!)

for _ in $(seq 50); do
  ctl list > /dev/null 2>&1 && break
  sleep 0.2
done

echo "== coordinator on $address (mutual TLS, certificates in $certs), metrics on http://127.0.0.1:$metrics_port/metrics"
echo "== submitting $run/job.yaml"
id=$(ctl submit "$run/job.yaml")
echo "== watching $id"
status=0
ctl watch "$id" || status=$?
echo
ctl status "$id"

entropy=$(/usr/bin/python3 - "$run/data/val.txt" <<'PY'
import math, sys, collections
data = open(sys.argv[1], 'rb').read()
counts = collections.Counter(data)
print(f"{-sum(c / len(data) * math.log(c / len(data)) for c in counts.values()):.4f}")
PY
)
val=$(ctl status "$id" | sed -n 's/.*val \([0-9.]*\).*/\1/p' | tail -1)
echo "== validation loss ${val:-?} nats/byte against the text's byte (unigram) entropy of $entropy nats"
echo "== metrics: curl -s http://127.0.0.1:$metrics_port/metrics | grep ^loom_job"
curl -s "http://127.0.0.1:$metrics_port/metrics" | grep -E '^loom_job_(mfu|tokens_per_second|loss)' || true
echo "== logs: $run/coordinator.log $run/worker.log $run/worker/jobs/$id/"
exit $status
