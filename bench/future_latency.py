"""Set-to-wake latency of xsilo.proxystore futures, per connector.

A waiter thread blocks in future.result() for --idle-ms before another
thread sets the value; the time from set_result() being called to the
waiter having the value is recorded, --reps times per connector. Prints
medians and maxima and writes them as JSON with --out.

  PYTHONPATH=build/python /usr/bin/python3 bench/future_latency.py
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "python"))

import xsilo.proxystore as ps  # noqa: E402
from ps_util import RedisServer  # noqa: E402


def measure(store, reps, idle):
    out = []
    for _ in range(reps):
        f = store.future()
        ready, got = threading.Event(), {}

        def wait():
            ready.set()
            f.result(timeout=60)
            got["t"] = time.perf_counter()

        t = threading.Thread(target=wait)
        t.start()
        ready.wait()
        time.sleep(idle)
        start = time.perf_counter()
        f.set_result(b"x")
        t.join()
        out.append((got["t"] - start) * 1e3)
        store.evict(f.key)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--idle-ms", type=float, default=300)
    ap.add_argument("--out", help="JSON file to write")
    args = ap.parse_args()
    redis = RedisServer()
    rows = {}
    try:
        with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
            conns = {"file": ps.FileConnector(d),
                     "redis (engine)": ps.RedisConnector("127.0.0.1", redis.port, wire=False),
                     "redis (Store's path)": ps.RedisConnector("127.0.0.1", redis.port),
                     "local (Python, polled)": ps.LocalConnector()}
            for name, conn in conns.items():
                s = ps.Store(f"latency-{len(rows)}", conn)
                try:
                    lat = measure(s, args.reps, args.idle_ms / 1000)
                finally:
                    s.close()
                rows[name] = {"median_ms": statistics.median(lat), "max_ms": max(lat),
                              "samples_ms": lat}
                print(f"{name:24s} median {statistics.median(lat):8.2f} ms   max {max(lat):8.2f} ms",
                      flush=True)
    finally:
        redis.stop()
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"reps": args.reps, "idle_ms": args.idle_ms, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
