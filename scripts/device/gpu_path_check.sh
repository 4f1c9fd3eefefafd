#!/usr/bin/env bash
# Issue 8's device check, the part that exists today: on the device machine
# (one H200; CUDA 13, PyTorch with nvidia-nccl-cu13; no Abseil/GoogleTest) it
# runs the NCCL Communicator's GPU tests from binaries prebuilt here by
# scripts/device/build_gpu_path_bins.sh, against PyTorch's libnccl.so.2.
# With one GPU the group-of-one, rendezvous-timeout and abort tests run; the
# multi-device tests skip (NCCL allows one rank per device per communicator).
# Bounded to 2 minutes; logs to $OUT.
#
# Here:    scripts/device/build_gpu_path_bins.sh
# Device:  run(command="scripts/device/gpu_path_check.sh", carry=["build-gpu/device-bin"],
#              timeout_s=180)
#
# Not yet here (docs/gpu.md, "Left to run"): the GPU backend's 20-step loss
# against the CPU backend, and the ~1B Llama in bf16 and fp8 with tokens/s and
# MFU beside PyTorch's step; they need the CUDA ops backend and a GPU trainer.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/loom-device-out}
bins=${BINS:-build-gpu/device-bin}
mkdir -p "$out"
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
  echo "missing $bins/gpu_nccl_communicator_test: run scripts/device/build_gpu_path_bins.sh here and carry $bins"
  rc=2
fi
echo "gpu_nccl_communicator_test: rc=$rc" | tee "$out/summary.txt"
exit $rc
