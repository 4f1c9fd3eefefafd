#!/usr/bin/env bash
# Restores the binaries that scripts/device/build_gpu_trainer.sh packed
# (SRC/NAME.xz, SRC/SHA256SUMS) into DST, executable, and checks their
# checksums. Plain (uncompressed) executables in SRC are copied as they are.
# Uses xz where installed, else Python's lzma (the device image has Python).
#   scripts/device/unpack_bins.sh SRC DST
set -euo pipefail
src=$(cd "$1" && pwd)
dst=$2
mkdir -p "$dst"
shopt -s nullglob
for f in "$src"/*.xz; do
  name=$(basename "$f" .xz)
  if command -v xz > /dev/null; then
    xz -dc "$f" > "$dst/$name"
  else
    "${PYTHON:-python3}" -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$f" "$dst/$name"
  fi
  chmod +x "$dst/$name"
done
for f in "$src"/*; do
  case "$f" in *.xz|*/SHA256SUMS) continue ;; esac
  [ -f "$f" ] && [ -x "$f" ] && cp "$f" "$dst/"
done
if [ -f "$src/SHA256SUMS" ]; then
  (cd "$dst" && sha256sum --quiet -c "$src/SHA256SUMS")
fi
