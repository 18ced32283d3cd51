#!/usr/bin/env bash
# Installs the Debian packages xsilo needs to build and test, then the npm
# packages of package.json (s3rver, which the S3 tests run). Idempotent:
# packages already installed are skipped, apt-get runs only when something
# is missing (needs root or sudo only then), npm only when node_modules
# lacks s3rver.
set -euo pipefail

PACKAGES=(
  # toolchain
  build-essential cmake pkg-config ccache clang libclang-rt-14-dev
  # core (zstd: the lossless tensor codec, docs/compression.md)
  nlohmann-json3-dev libxxhash-dev libcli11-dev libzstd-dev
  # the logger's formatting (src/core/log.cpp)
  libspdlog-dev
  # store (redis connector; redis-server runs in the tests)
  libhiredis-dev redis-server
  # store: the zmq connector (libzmq)
  libzmq3-dev
  # grpc transport
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  # tests
  libgtest-dev libgmock-dev
  # s3: client (libcurl, OpenSSL for SigV4) and embedded server; curl CLI for interop tests
  libcurl4-openssl-dev libssl-dev zlib1g-dev curl
  # load on `xsilo s3d` (bench/s3d_load.cpp, ctest s3d_load_short)
  wrk
  # s3 interop tests: boto3 against the embedded server and s3rver, run by pytest from ctest
  python3-boto3 python3-pytest
  # S3 clients people already have, run against `xsilo s3d` by tests/s3/clients/:
  # the AWS CLI v2 (brings python3-awscrt, botocore's CRT signer: the boto3
  # tests run with and without it), s3cmd, rclone
  awscli s3cmd rclone
  # mpi-generic / mpi-buffer transports (Open MPI)
  libopenmpi-dev openmpi-bin
  # tensorpipe transport (optional: without it the backend is not built)
  libtensorpipe-dev
  # ucx connector (optional: without it the connector is not built)
  libucx-dev
  # endpoint: UDP hole punching (ICE and pseudo-TCP)
  libnice-dev
  # netem (namespaces; iperf3 for `xsilo netem check`)
  iproute2 iperf3
  # netem sites behind a NAT (nftables masquerade in a NAT box namespace)
  nftables
  # fl: the built-in MLP trainer and the FedAvg aggregator
  libeigen3-dev
  # s3rver (npm package, package.json), the S3 server our client is tested against
  nodejs
  # `xsilo bench plot` (scripts/plot_p2p.py)
  python3-matplotlib
  # the Python module (python/): pybind11, DLPack, and what its tests and
  # example use (Debian's torch, numpy, pytest)
  python3-dev pybind11-dev python3-pybind11 libdlpack-dev python3-numpy python3-torch
  python3-pytest python3-pytest-timeout
  # the packaging test pip-installs the build tree (tests/python/test_packaging.py)
  python3-pip python3-setuptools python3-wheel
  # xsilo.proxystore (docs/python.md): transparent proxies (lazy-object-proxy's
  # C extension), cloudpickle for lambdas and local classes, stream brokers
  # (redis-py, pyzmq); pydantic runs ProxyStore 0.6.5 in bench/proxystore_compare.py
  python3-lazy-object-proxy python3-cloudpickle python3-redis python3-zmq python3-pydantic
  # a one-node Ceph cluster with a RADOS Gateway (scripts/ceph-rgw.sh), the
  # real S3 engine the tests in tests/ceph/ run against; uuidgen for its fsid
  ceph-mon ceph-mgr ceph-osd radosgw ceph-common uuid-runtime
)
# Debian's npm, unless an npm is already there (NodeSource's nodejs bundles
# one and conflicts with Debian's npm package).
if ! command -v npm >/dev/null 2>&1; then
  PACKAGES+=(npm)
fi

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

install_npm_packages() {
  if [ -x "$ROOT/node_modules/.bin/s3rver" ]; then
    return 0
  fi
  echo "install-deps: npm install (s3rver) in $ROOT"
  (cd "$ROOT" && npm install --no-audit --no-fund)
}

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  install_npm_packages
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
install_npm_packages
