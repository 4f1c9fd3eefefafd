#!/usr/bin/env bash
# Installs every Debian package Loom needs to build, test and run its demo.
# Idempotent and non-interactive: packages already present are skipped, so a
# second run costs one dpkg query.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev prometheus-cpp-dev libgloo-dev libopenblas-dev
  libsqlite3-dev libyaml-cpp-dev nlohmann-json3-dev
  etcd-server etcd-client
  libgtest-dev libgmock-dev libbenchmark-dev
  python3-torch python3-grpcio python3-protobuf python3-numpy python3-yaml
  python3-setuptools python3-venv python3-pip
  prometheus curl openssl systemd shellcheck
)

# kubectl for `kubectl kustomize` (deploy/kubernetes checks): Debian's, unless
# one is already on the PATH. Node.js and npm for tools/k8s-validate.
if ! command -v kubectl > /dev/null; then packages+=(kubernetes-client); fi
if ! command -v npm > /dev/null; then packages+=(nodejs npm); fi
# A real Slurm for the deploy/slurm test (tests/deploy/test_slurm.py).
packages+=(slurm-wlm slurmctld slurmd slurm-client munge)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#packages[@]} packages present"
else
  echo "install_deps: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# npm packages, project-local: the Kubernetes schema validator.
validator="$(dirname "$0")/../tools/k8s-validate"
if [ ! -d "$validator/node_modules" ] || [ "$validator/package-lock.json" -nt "$validator/node_modules" ]; then
  echo "install_deps: npm ci in tools/k8s-validate"
  (cd "$validator" && npm ci --no-audit --no-fund --loglevel=error)
fi
