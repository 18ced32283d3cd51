#!/usr/bin/env bash
# Runs the tests of a sanitized build tree (make asan, make sanitize, make
# tsan) through scripts/run-ctest.sh, so a skipped test fails here too.
# Usage: scripts/run-sanitized.sh <build dir> <parallel jobs> <suite|all>...
#   a suite is a test binary's name (its tests' ctest label); "all" runs
#   every test of the tree.
# A sanitizer's report ends the test with an error (halt_on_error), and the
# report is in ctest's output. Cases that move several GiB or measure this
# process's RSS are left to the optimized run (their figures mean nothing
# under a sanitizer's shadow memory and quarantine, s3d_load_short's RSS
# bound among them), and fl_mlp_isa_symbols, which inspects the optimized
# build's AVX2 object (a Debug build keeps inline library code and UBSan's
# typeinfo there): XSILO_SANITIZER_EXCLUDE.
set -euo pipefail
build=$1
jobs=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
args=()
if [ "$*" != "all" ]; then
  labels=$(printf '%s|' "$@")
  args+=(-L "^(${labels%|})\$")
fi
exclude=${XSILO_SANITIZER_EXCLUDE:-'TensorOver2GiB|BroadcastSharesPayload|PayloadSizes|Huge|Over2GiB|Rss|PeakMemory|^s3d_load_short$|^fl_mlp_isa_symbols$'}
args+=(-E "$exclude")
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1:halt_on_error=1:abort_on_error=0}
# Open MPI leaks what its components allocate at MPI_Init (lsan.supp).
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$here/lsan.supp:print_suppressions=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:report_signal_unsafe=0:suppressions=$here/tsan.supp}
# UCX intercepts mmap through a hook that TSan's interceptors cannot share.
export UCX_MEM_MMAP_HOOK_MODE=${UCX_MEM_MMAP_HOOK_MODE:-none}
exec "$here/run-ctest.sh" "$build" "$jobs" "${args[@]}"
