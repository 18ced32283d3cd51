#!/usr/bin/env bash
# Runs a tiny `xsilo bench p2p` on lan and checks that the JSON and CSV
# files hold the expected rows (one per backend, latency samples, the
# Figure 2 points, the link reference). mpi-buffer runs under mpirun when
# Open MPI is installed and this build has the MPI transports, and is
# listed as not run otherwise.
set -euo pipefail
XSILO="$1"
OUT="$(mktemp -d /tmp/xsilo-bench-test-XXXXXX)"
trap 'rm -rf "$OUT"' EXIT

"$XSILO" bench p2p --envs lan --tiers small,medium --backends grpc,grpc+s3,mpi-buffer \
  --repeats 2 --link-seconds 1 --broadcast-peers 2 --dispatch 1,3 --dispatch-tier small \
  --skip lan:medium --passes 2 --out "$OUT"

MPI=0
# The list is read whole first: `xsilo backends | grep -q` would end the
# pipe early, and under pipefail xsilo's SIGPIPE would make it fail.
BACKENDS="$("$XSILO" backends)"
if command -v mpirun >/dev/null 2>&1 && grep -q '^mpi-buffer ' <<<"$BACKENDS"; then MPI=1; fi
python3 - "$OUT" "$MPI" <<'PY'
import csv, json, os, statistics, sys
d = sys.argv[1]
mpi = sys.argv[2] == "1"
r = json.load(open(os.path.join(d, "p2p.json")))
runs = r["runs"]
expected = ["grpc", "grpc+s3"] + (["mpi-buffer"] if mpi else [])
assert [x["backend"] for x in runs] == expected, runs
for x in runs:
    assert "error" not in x, x
    assert x["env"] == "lan" and x["tier"] == "small" and x["bytes"] == 591322 * 4
    # 2 passes of 2 timed sends, pooled; (b) and Figure 2 from the first pass.
    assert len(x["latency_ms"]) == 4 and all(v > 0 for v in x["latency_ms"])
    assert len(x["pass_medians_ms"]) == 2
    assert abs(x["latency_median_ms"] - statistics.median(x["latency_ms"])) < 1e-9, x
    assert x["latency_p95_ms"] >= x["latency_median_ms"]
    assert x["latency_p95_ms"] >= x["latency_median_ms"] > 0
    assert x["concurrency"]["n"] == 10 and x["concurrency"]["speedup"] > 0
    assert [p["n"] for p in x["dispatch"]] == [1, 3]
    assert all(p["peak_bytes"] >= x["bytes"] for p in x["dispatch"])
    assert x["broadcast"]["peers"] == 2 and x["broadcast"]["peak_bytes"] > 0
    assert 0 <= x["serialization_share"] <= 1
    assert x["floor_ms"] > 0
skipped = [n for n in r["not_run"] if n.get("tier") == "medium"]
assert [n["backend"] for n in skipped] == ["grpc", "grpc+s3", "mpi-buffer"], r["not_run"]
assert all("--skip lan:medium" in n["reason"] for n in skipped), skipped
assert r["config"]["skip_cells"] == ["lan:medium"] and r["config"]["passes"] == 2
others = [n for n in r["not_run"] if n.get("tier") != "medium"]
assert [n["backend"] for n in others] == ([] if mpi else ["mpi-buffer"]), r["not_run"]
assert len(r["links"]) == 1 and r["links"][0]["measured"] and r["links"][0]["single_MBps"] > 0
rows = list(csv.DictReader(open(os.path.join(d, "p2p.csv"))))
assert [(x["env"], x["tier"], x["backend"]) for x in rows] == [
    ("lan", "small", b) for b in expected], rows
assert all(float(x["latency_median_ms"]) > 0 and x["error"] == "" for x in rows)
rows = list(csv.DictReader(open(os.path.join(d, "dispatch.csv"))))
assert [(x["backend"], x["n"]) for x in rows] == [(b, n) for b in expected for n in ("1", "3")], rows
rows = list(csv.DictReader(open(os.path.join(d, "links.csv"))))
assert [x["env"] for x in rows] == ["lan"]
print("bench_p2p_smoke: ok")
PY
# --min-seconds: more timed sends than --repeats, until they add up to the
# time asked (or the cap).
"$XSILO" bench p2p --envs lan --tiers small --backends grpc --repeats 2 --min-seconds 0.3 \
  --link-seconds 0 --broadcast-peers 0 --dispatch-envs none --no-concurrency --out "$OUT/min"
python3 - "$OUT/min" <<'PY'
import json, os, sys
r = json.load(open(os.path.join(sys.argv[1], "p2p.json")))
assert r["config"]["min_seconds"] == 0.3, r["config"]
[x] = r["runs"]
lat = x["latency_ms"]
# (Two sends may take 300 ms on their own in a stall of the machine.)
assert len(lat) > 2 or sum(lat) >= 300, lat
assert sum(lat) >= 300 or len(lat) == 2000, (len(lat), sum(lat))
assert len(lat) == 2 or sum(lat[:-1]) < 300, "sent on after reaching the time"
print("bench_p2p_smoke --min-seconds: %d sends, %.0f ms" % (len(lat), sum(lat)))
PY
# The endpoint rows: every peer's own endpoint, the sender's relay; the
# receiver's endpoint reached the sender's directly or through the relay,
# and neither holds an object at the end (medium: above the 10 MiB threshold).
"$XSILO" bench p2p --envs lan --tiers medium --backends grpc+endpoint,grpc+endpoint-relayed \
  --repeats 1 --link-seconds 0 --broadcast-peers 0 --dispatch-envs none --no-concurrency \
  --out "$OUT/endpoint"
python3 - "$OUT/endpoint" <<'PY'
import json, os, sys
r = json.load(open(os.path.join(sys.argv[1], "p2p.json")))
runs = r["runs"]
assert [x["backend"] for x in runs] == ["grpc+endpoint", "grpc+endpoint-relayed"], runs
for x, path, other in zip(runs, ["direct", "relayed"], ["relayed", "direct"]):
    assert "error" not in x, x
    assert x["endpoint"] == path and len(x["latency_ms"]) == 1, x
    st = x["endpoint_status"]
    assert st["sender"]["objects"] == 0 and st["receiver1"]["objects"] == 0, st
    # warm-up and one timed send, each one remote GET
    assert st["receiver1"]["served"][path] == 2 and st["receiver1"]["served"][other] == 0, st
print("bench_p2p_smoke endpoint rows: ok")
PY
# Unknown backends and malformed --skip cells are refused before anything runs.
for cell in lan:huge lann:small lan:small:nope lan; do
  if "$XSILO" bench p2p --envs lan --skip "$cell" --out "$OUT/y" 2>"$OUT/skip.err"; then
    echo "--skip $cell accepted" >&2
    exit 1
  fi
  grep -q "expected ENV:TIER or ENV:TIER:BACKEND" "$OUT/skip.err" || {
    cat "$OUT/skip.err" >&2
    exit 1
  }
done
for bad in "--min-seconds nan" "--min-seconds -1" "--repeats 0"; do
  # shellcheck disable=SC2086
  if "$XSILO" bench p2p --envs lan $bad --out "$OUT/z" 2>/dev/null; then
    echo "$bad accepted" >&2
    exit 1
  fi
done
if "$XSILO" bench p2p --envs lan --backends nope --out "$OUT/x" 2>/dev/null; then
  echo "unknown backend accepted" >&2
  exit 1
fi
