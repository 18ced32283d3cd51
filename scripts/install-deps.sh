#!/usr/bin/env bash
# Installs the Debian packages xsilo needs, then (for the tests) the npm
# packages of package.json (s3rver, which the S3 tests run).
#
#   install-deps.sh run    what `make run` needs: the toolchain and the
#                          libraries the xsilo binary links (no test, Python,
#                          MPI, TensorPipe, Ceph or S3-client packages)
#   install-deps.sh test   everything `make test` needs (the default)
#
# Idempotent: packages already installed are skipped, apt-get runs only when
# something is missing (needs root or sudo only then), npm only when
# node_modules lacks s3rver.
set -euo pipefail

MODE="${1:-test}"
case "$MODE" in
  run | test) ;;
  *)
    echo "install-deps: unknown mode '$MODE': run or test" >&2
    exit 2
    ;;
esac

# What the xsilo binary is built from and the main job runs on.
RUN_PACKAGES=(
  # toolchain
  build-essential cmake pkg-config ccache
  # core (zstd: the lossless tensor codec, docs/compression.md)
  nlohmann-json3-dev libxxhash-dev libcli11-dev libzstd-dev
  # the logger's formatting (src/core/log.cpp)
  libspdlog-dev
  # store: the redis connector (hiredis) and the zmq connector (libzmq)
  libhiredis-dev libzmq3-dev
  # grpc transport
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  # s3: client (libcurl, OpenSSL for SigV4) and embedded server
  libcurl4-openssl-dev libssl-dev zlib1g-dev
  # endpoint: UDP hole punching (ICE and pseudo-TCP)
  libnice-dev
  # fl: the built-in MLP trainer and the FedAvg aggregator
  libeigen3-dev
)

# What the tests, the benchmarks, the sanitizer runs and the Python module
# need beyond RUN_PACKAGES.
TEST_PACKAGES=(
  # the sanitizer and fuzz builds (make asan, make tsan, make fuzz)
  clang libclang-rt-14-dev
  # redis-server runs in the store tests
  redis-server
  # tests
  libgtest-dev libgmock-dev
  # curl CLI for the S3 interop tests
  curl
  # load on `xsilo s3d` (bench/s3d_load.cpp, ctest s3d_load_short)
  wrk
  # s3 interop tests: boto3 against the embedded server and s3rver, run by pytest from ctest
  python3-boto3 python3-pytest
  # S3 clients people already have, run against `xsilo s3d` by tests/s3/clients/:
  # the AWS CLI v2 (brings python3-awscrt, botocore's CRT signer: the boto3
  # tests run with and without it), s3cmd, rclone
  awscli s3cmd rclone
  # mpi-generic / mpi-buffer transports (Open MPI; without it they are not built)
  libopenmpi-dev openmpi-bin
  # tensorpipe transport (without it the backend is not built)
  libtensorpipe-dev
  # ucx connector (without it the connector is not built)
  libucx-dev
  # netem (namespaces; iperf3 for `xsilo netem check`)
  iproute2 iperf3
  # netem sites behind a NAT (nftables masquerade in a NAT box namespace)
  nftables
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

PACKAGES=("${RUN_PACKAGES[@]}")
if [ "$MODE" = test ]; then
  PACKAGES+=("${TEST_PACKAGES[@]}")
fi
# Debian's npm, unless an npm is already there (NodeSource's nodejs bundles
# one and conflicts with Debian's npm package).
if [ "$MODE" = test ] && ! command -v npm >/dev/null 2>&1; then
  PACKAGES+=(npm)
fi

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

install_npm_packages() {
  if [ "$MODE" != test ] || [ -x "$ROOT/node_modules/.bin/s3rver" ]; then
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
  echo "install-deps ($MODE): all ${#PACKAGES[@]} packages present"
  install_npm_packages
  exit 0
fi

echo "install-deps ($MODE): installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
install_npm_packages
