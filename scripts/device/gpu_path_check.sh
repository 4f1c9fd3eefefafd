#!/usr/bin/env bash
# Issue 8's device check, the part that exists today: on the device machine
# (one H200; CUDA 13, PyTorch with nvidia-nccl-cu13; no Abseil/GoogleTest) it
# runs the NCCL Communicator's GPU tests and context parallelism's ring tests from binaries prebuilt here by
# scripts/device/build_gpu_path_bins.sh, against PyTorch's libnccl.so.2.
# With one GPU the group-of-one, rendezvous-timeout and abort tests run; the
# multi-device tests skip (NCCL allows one rank per device per communicator).
# The expert dispatcher's integer all-to-all (AllToAllInt64, exact beyond 2^53)
# runs in the group-of-one test; its uneven row all-to-all and the integer one
# across ranks run in CollectivesAcrossDevices where two or more GPUs exist.
# Without a device the dispatcher's buffers are checked to be backend memory
# by tests/engine_device/ep_exchange_device_test.cc.
# Bounded to 2 minutes; logs to $OUT.
#
# Here:    scripts/device/build_gpu_path_bins.sh
# Device:  run(command="scripts/device/gpu_path_check.sh", carry=["build-gpu/device-bin"],
#              timeout_s=180)
#
# The whole GPU training check (these tests, cuda_ops_test, the 20-step loss
# against the CPU and the ~1B Llama beside PyTorch) is
# scripts/device/gpu_train_check.sh; this script is its NCCL part alone.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/loom-device-out}
packed=${BINS:-build-gpu/device-bin}
bins=/tmp/loom-device-bin
mkdir -p "$out"
# build_gpu_trainer.sh packs the binaries as NAME.xz.
scripts/device/unpack_bins.sh "$packed" "$bins" || echo "unpacking $packed failed"
{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())"
} 2>&1 | tee "$out/machine.txt"

# PyTorch's NCCL: site-packages/nvidia/nccl/lib (nvidia-nccl-cu13).
nccl_lib=$(python3 - <<'PY'
import glob, os, site
roots = site.getsitepackages() + [site.getusersitepackages()]
for r in roots:
    for d in glob.glob(os.path.join(r, "nvidia", "nccl*", "lib")) + glob.glob(os.path.join(r, "nvidia", "*", "lib")):
        if os.path.exists(os.path.join(d, "libnccl.so.2")):
            print(d); raise SystemExit
PY
)
echo "libnccl.so.2 from: ${nccl_lib:-NOT FOUND}" | tee -a "$out/machine.txt"
export LD_LIBRARY_PATH="${nccl_lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

rc=0
if [ -x "$bins/gpu_nccl_communicator_test" ]; then
  NCCL_DEBUG=${NCCL_DEBUG:-WARN} timeout 120 "$bins/gpu_nccl_communicator_test" 2>&1 | tee "$out/nccl_test.txt"
  rc=${PIPESTATUS[0]}
else
  echo "missing $packed/gpu_nccl_communicator_test.xz: run scripts/device/build_gpu_trainer.sh here and carry $packed"
  rc=2
fi
echo "gpu_nccl_communicator_test: rc=$rc" | tee "$out/summary.txt"
# Context parallelism's GPU path (docs/context_parallel.md): the LSE merge and
# ring attention's blocks on the device against the CPU; the ring over NCCL
# runs with two devices and skips on one.
if [ -x "$bins/gpu_ring_attention_test" ]; then
  timeout 120 "$bins/gpu_ring_attention_test" 2>&1 | tee "$out/ring_test.txt"
  ring_rc=${PIPESTATUS[0]}
else
  echo "missing $packed/gpu_ring_attention_test.xz: run scripts/device/build_gpu_trainer.sh here"
  ring_rc=2
fi
echo "gpu_ring_attention_test: rc=$ring_rc" | tee -a "$out/summary.txt"
[ "$rc" = 0 ] && rc=$ring_rc
exit $rc
