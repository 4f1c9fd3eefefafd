#!/usr/bin/env bash
# Runs every test: installs what is needed, builds, then ctest. Tests that need
# a GPU skip themselves here. Extra arguments go to ctest (e.g. -R engine).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
cd build
# Every tool a test needs was installed above: a test that finds one missing
# fails instead of skipping (tests/deploy/deploy_test_env.py).
export LOOM_REQUIRE_TEST_TOOLS=1
ctest --output-on-failure --timeout 600 -j "${LOOM_TEST_JOBS:-2}" "$@"
