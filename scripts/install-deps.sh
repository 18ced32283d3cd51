#!/usr/bin/env bash
# Installs the Debian packages xsilo needs to build and test. Idempotent:
# packages already installed are skipped, and apt-get runs only when
# something is missing. Needs root (or sudo) only in that case.
set -euo pipefail

PACKAGES=(
  # toolchain
  build-essential cmake pkg-config ccache clang libclang-rt-14-dev
  # core
  nlohmann-json3-dev libxxhash-dev libcli11-dev
  # store (redis connector; redis-server runs in the tests)
  libhiredis-dev redis-server
  # tests
  libgtest-dev libgmock-dev
  # mpi-generic / mpi-buffer transports (Open MPI)
  libopenmpi-dev openmpi-bin
  # fl: the built-in MLP trainer and the FedAvg aggregator
  libeigen3-dev
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
