#!/usr/bin/env bash
# Runs a tiny `xsilo bench e2e` on lan (loopback, no root): 1 server and 2
# clients, one round of the small tier, into the same folder twice, and
# checks the logs and the JSON it writes: the job finished, its per-state
# times, its final figures, the CPU and peak memory the operating system
# counted for its parties, and the round's timeline.
set -euo pipefail
XSILO="$1"
OUT="$(mktemp -d /tmp/xsilo-bench-e2e-test-XXXXXX)"
trap 'rm -rf "$OUT"' EXIT

# Twice into the same folder, the second time with grpc listed twice: the
# second command's logs must not hold the first's, and hold both its rows.
"$XSILO" bench e2e --env lan --tiers small --backends grpc --clients 2 --rounds 1 \
  --local-steps 1 --timeout 240 --out "$OUT"
"$XSILO" bench e2e --env lan --tiers small --backends grpc,grpc --clients 2 --rounds 1 \
  --local-steps 1 --timeout 240 --out "$OUT"
for log in server client1 client2; do
  n=$(grep -c "^xsilo fl " "$OUT/grpc-small/$log.log")
  [ "$n" = 2 ] || { echo "$log.log holds $n jobs' logs, not the last command's 2"; exit 1; }
done

python3 - "$OUT" <<'PY'
import json, os, sys
d = sys.argv[1]
r = json.load(open(os.path.join(d, "e2e.json")))
assert r["env"] == "lan" and r["clients"] == 2 and r["rounds"] == 1, r
runs = r["runs"]
assert [x["backend"] for x in runs] == ["grpc", "grpc"], runs
x = runs[-1]
assert x["ok"] and "error" not in x, x
assert x["rounds_s"] > 0 and x["wall_s"] >= x["rounds_s"], x
assert x["final"]["clients"] == 2, x["final"]
c = x["cpu"]
# Every party ran a process that did work: the small model (591,322
# floats) was built, trained and sent, so each used CPU and held at least
# the model's 2.4 MB; the parties' sum is at most what the cores had.
assert c["server_s"] > 0 and c["clients_s"] > 0 and c["client_max_s"] > 0, c
assert c["client_max_s"] <= c["clients_s"] + 1e-9, c
assert c["router_s"] == 0, c  # loopback: no emulator
assert abs(c["total_s"] - (c["server_s"] + c["clients_s"])) < 1e-6, c
# CPU time cannot exceed the wall time times the CPUs; 2% over allows a
# cgroup quota's burst, which lets a short run overdraw its quota.
assert c["cores"] > 0 and 0 < c["busy"] <= 1.02, c
# The host's CPUs during the round, sampled every 250 ms: a share, or -1
# when the round was shorter than two samples.
assert c["rounds_host_busy"] == -1 or 0 <= c["rounds_host_busy"] <= 1, c
assert all(r["started_unix_s"] > 1.7e9 for r in json.load(
    open(os.path.join(d, "grpc-small", "server.json")))["rounds"])
assert c["server_max_rss_bytes"] > 591322 * 4 and c["client_max_rss_bytes"] > 591322 * 4, c
# The round's timeline: both clients' updates, stamped in order.
[t] = x["round_timelines"]
assert t["round"] == 0 and 0 <= t["broadcast_s"] <= t["seconds"], t
assert sorted(u["rank"] for u in t["timeline"]) == [1, 2], t
for u in t["timeline"]:
    assert 0 <= u["model_at_s"] + u["train_s"] <= u["sent_at_s"] + 1e-3, t
    assert u["sent_at_s"] <= u["arrived_s"] + 1e-3 and u["arrived_s"] <= t["seconds"], t
print("e2e smoke: ok; CPU", round(c["total_s"], 2), "s,", round(100 * c["busy"]), "% busy")
PY
