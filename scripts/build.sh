#!/usr/bin/env bash
# Configures and builds Loom into build/ (binaries in build/bin/). Installs the
# Debian packages first; safe to run again (incremental).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install_deps.sh
jobs="${LOOM_BUILD_JOBS:-$(nproc)}"
if [ ! -f build/build.ninja ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
fi
cmake --build build -j "$jobs"
