#!/usr/bin/env bash
# Runs every test: installs what is needed, builds, then ctest. Tests that need
# a GPU skip themselves here. Extra arguments go to ctest (e.g. -R engine).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
cd build
ctest --output-on-failure --timeout 600 -j "${LOOM_TEST_JOBS:-2}" "$@"
