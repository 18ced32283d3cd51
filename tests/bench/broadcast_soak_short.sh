#!/usr/bin/env bash
# The short form of bench/broadcast_soak: a grpc server broadcasting the
# Small model to 8 client processes for 3 rounds. Behaviour only: every
# client acks every round with a verified model, the server's descriptors
# do not grow, every client exits 0. Then each fault the program must
# report is injected once and must be reported (exit 1 and its FAIL line).
#
#   broadcast_soak_short.sh BROADCAST_SOAK_BINARY
set -u
bin=${1:?usage: broadcast_soak_short.sh BROADCAST_SOAK_BINARY}
if [[ ! -x $bin ]]; then
  echo "FAIL: broadcast_soak binary '$bin' is missing (build target broadcast_soak)"
  exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
short=(--backend grpc --tier small --clients 8 --rounds 3 --round-timeout-s 120)
status=0

"$bin" "${short[@]}" --json "$work/ok.json" >"$work/ok.txt" 2>&1
rc=$?
if [[ $rc -ne 0 ]] || ! grep -qs '"ok": true' "$work/ok.json" || ! grep -q ': ok$' "$work/ok.txt"; then
  echo "FAIL: the clean run exited $rc"
  cat "$work/ok.txt"
  status=1
elif [[ $(grep -cs '"acked": 8,' "$work/ok.json") -ne 3 ]]; then
  echo "FAIL: the clean run did not have 8 acks in each of 3 rounds"
  cat "$work/ok.txt"
  status=1
else
  echo "ok: clean run, 3 rounds x 8 clients acked"
fi

# inject -> the FAIL line it must produce
declare -A want=([damage]='FAIL damaged' [skip]='FAIL missed' [fd-leak]='FAIL fds'
                 [rss-leak]='FAIL rss')
for inject in damage skip fd-leak rss-leak; do
  "$bin" "${short[@]}" --inject "$inject" --json "$work/$inject.json" >"$work/$inject.txt" 2>&1
  rc=$?
  if [[ $rc -ne 1 ]] || ! grep -q "^${want[$inject]}" "$work/$inject.txt"; then
    echo "FAIL: --inject $inject exited $rc without '${want[$inject]}'"
    cat "$work/$inject.txt"
    status=1
  else
    echo "ok: --inject $inject reported: $(grep "^${want[$inject]}" "$work/$inject.txt")"
  fi
done
exit $status
