#!/usr/bin/env bash
# Runs every ctest test of a build tree the way `make test` does: with
# XSILO_REQUIRE_ALL=1, so a test whose prerequisite is missing fails instead
# of skipping (tests/require.h). Prints how many tests were skipped, and
# fails when any was: a skipped test is one that did not run.
# Usage: scripts/run-ctest.sh <build dir> <parallel jobs> [ctest arguments...]
set -euo pipefail
build=$1
jobs=${2:-2}
shift 2 || shift $#
cd "$build"
log=ctest.log
set +e
XSILO_REQUIRE_ALL=1 ctest --output-on-failure -j "$jobs" "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
# ctest's summary lists each skipped test as "<n> - <name> (Skipped)".
skipped=$(grep -cE '^[[:space:]]*[0-9]+ - .* \(Skipped\)$' "$log" || true)
ran=$(grep -oE 'tests passed, [0-9]+ tests failed out of [0-9]+' "$log" | tail -1 || true)
echo "ctest: ${ran:-no summary}; skipped: $skipped"
if [ "$rc" -ne 0 ]; then exit "$rc"; fi
if [ "$skipped" -ne 0 ]; then
  echo "ctest: $skipped test(s) skipped; under make test a test that cannot run is a failure" >&2
  exit 1
fi
