"""ProxyStore 0.6.5 against xsilo's Python API (xsilo.proxystore), side by side.

The same operations through both, in one run: put, get (cold: nothing in
the store's cache), get + touch (the same, then one byte of every 4 KiB
page of the result read, so that lazily mapped bytes are paid for), proxy
resolve (cold), over the file and Redis connectors, for bytes and numpy
objects of 1 KB, 1 MB, 100 MB and 1 GB, beside a baseline (BaselineStore:
the bytes alone, moved once with Python's own calls); and an executor round trip: a 10
MB numpy argument to a process-pool worker that returns argument + 1,
resolved back in the caller (xsilo: StoreExecutor; ProxyStore 0.6.5 has no
executor, so the same steps by hand: proxy the argument with evict=True,
submit, the worker returns a proxy of its result). Each cell is the median
of its repetitions; the systems alternate within every cell.

ProxyStore runs from its own source (not part of xsilo), with Debian's
pydantic, cloudpickle, lazy-object-proxy and redis packages:

    git clone --bare https://github.com/proxystore/proxystore /tmp/proxystore.git  # or any mirror
    mkdir -p /tmp/proxystore-0.6.5
    git --git-dir=/tmp/proxystore.git archive v0.6.5 | tar -x -C /tmp/proxystore-0.6.5
    PYTHONPATH=build/python /usr/bin/python3 bench/proxystore_compare.py --proxystore /tmp/proxystore-0.6.5

(the script writes the dist-info stub ProxyStore's __init__ asks
importlib.metadata for, if it is missing). Prints a table and writes JSON
(default results/proxystore_compare/proxystore_compare.json).
"""

import argparse
import datetime
import gc
import json
import multiprocessing
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from concurrent.futures import ProcessPoolExecutor

import numpy

SIZES = {"1KB": 1 << 10, "1MB": 1 << 20, "100MB": 100 << 20, "1GB": 1 << 30}
REPS = {"1KB": 100, "1MB": 20, "100MB": 5, "1GB": 3}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis():
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--proto-max-bulk-len", "4294967296",
         "--client-query-buffer-limit", "4294967296", "--loglevel", "warning"],
        stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def import_proxystore(path):
    meta = os.path.join(path, "proxystore-0.6.5.dist-info")
    if not os.path.exists(os.path.join(meta, "METADATA")):
        os.makedirs(meta, exist_ok=True)
        with open(os.path.join(meta, "METADATA"), "w") as f:
            f.write("Metadata-Version: 2.1\nName: proxystore\nVersion: 0.6.5\n")
    sys.path.insert(0, path)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [path, os.environ.get("PYTHONPATH")]))
    import proxystore

    return proxystore.__version__


def make_object(kind, size):
    if kind == "numpy":
        return numpy.arange(size // 8, dtype=numpy.float64)
    return numpy.arange(size // 8, dtype=numpy.uint64).tobytes()


def touch(obj):
    """Reads one byte of every 4 KiB page (faults in mmap-backed results)."""
    a = obj if isinstance(obj, numpy.ndarray) else numpy.frombuffer(obj, dtype=numpy.uint8)
    return int(a.view(numpy.uint8)[::4096].sum())


# -- the two systems behind one interface ------------------------------------

class System:
    def __init__(self, name, store, extract, resolve, clear_cache, get_key):
        self.name = name
        self.get_key = get_key
        self.store = store
        self.extract = extract
        self.resolve = resolve
        self.clear_cache = clear_cache


def proxystore_system(connector, root, redis_port, tag):
    from proxystore.connectors.file import FileConnector
    from proxystore.connectors.redis import RedisConnector
    from proxystore.proxy import extract, resolve
    from proxystore.store import Store, register_store
    from proxystore.store.utils import get_key

    conn = (FileConnector(os.path.join(root, f"ps-{tag}")) if connector == "file"
            else RedisConnector("127.0.0.1", redis_port))
    store = Store(f"ps-{tag}", conn)
    register_store(store)
    return System("proxystore", store, extract, resolve, lambda k: store.cache.evict(k), get_key)


def xsilo_system(connector, root, redis_port, tag):
    import xsilo.proxystore as xp

    conn = (xp.FileConnector(os.path.join(root, f"xs-{tag}")) if connector == "file"
            else xp.RedisConnector("127.0.0.1", redis_port, prefix=f"xs-{tag}"))
    store = xp.Store(f"xs-{tag}", conn, register=True)

    def clear(k):
        with store._cache_lock:
            store._cache.pop(k, None)

    return System("xsilo", store, xp.extract, xp.resolve, clear, xp.get_key)


class BaselineStore:
    """The bytes alone, moved once with Python's own calls (no serialization,
    no metadata): put is one os.write() of the object's memory into a new
    file, or one Redis SET sent from it; get is one read() of the whole
    file into a new bytes object, or one GET read into a new bytearray
    (Python cannot read a socket into a bytes object). The "resolve" of a
    baseline key is its get. Not a floor: a store that avoids the copy
    (an mmap view) or the page faults of fresh memory (huge pages) beats it."""

    def __init__(self, connector, root, redis_port):
        self.connector = connector
        self.dir = os.path.join(root, "baseline")
        os.makedirs(self.dir, exist_ok=True)
        self.sock = None
        if connector == "redis":
            self.sock = socket.create_connection(("127.0.0.1", redis_port))
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.n = 0

    def _line(self):
        out = bytearray()
        while not out.endswith(b"\r\n"):
            c = self.sock.recv(1)
            if not c:
                raise ConnectionError("redis closed")
            out += c
        return bytes(out[:-2])

    def put(self, obj):
        self.n += 1
        key = f"baseline-{self.n}"
        mv = memoryview(obj).cast("B")
        if self.sock is None:
            fd = os.open(os.path.join(self.dir, key), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                done = 0
                while done < len(mv):
                    done += os.write(fd, mv[done:])
            finally:
                os.close(fd)
        else:
            k = key.encode()
            self.sock.sendall(b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n" % (len(k), k, len(mv)))
            self.sock.sendall(mv)
            self.sock.sendall(b"\r\n")
            if self._line() != b"+OK":
                raise RuntimeError("redis SET failed")
        return key

    def get(self, key):
        if self.sock is None:
            with open(os.path.join(self.dir, key), "rb", buffering=0) as f:
                return f.read()
        k = key.encode()
        self.sock.sendall(b"*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n" % (len(k), k))
        n = int(self._line()[1:])
        out = bytearray(n)
        mv, got = memoryview(out), 0
        while got < n:
            r = self.sock.recv_into(mv[got:])
            if not r:
                raise ConnectionError("redis closed")
            got += r
        self._line()
        return out

    def proxy(self, obj):
        return self.put(obj)

    def evict(self, key):
        if self.sock is None:
            os.unlink(os.path.join(self.dir, key))
        else:
            k = key.encode()
            self.sock.sendall(b"*2\r\n$3\r\nDEL\r\n$%d\r\n%s\r\n" % (len(k), k))
            self._line()

    def close(self):
        if self.sock is not None:
            self.sock.close()


def baseline_system(connector, root, redis_port):
    store = BaselineStore(connector, root, redis_port)
    return System("baseline", store, None, store.get, lambda k: None, lambda k: k)


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def bench_cell(sys_, op, obj, reps):
    s = sys_.store
    times = []
    for _ in range(reps):
        if op == "put":
            t, key = timed(lambda: s.put(obj))
        elif op in ("get", "get+touch"):
            key = s.put(obj)
            sys_.clear_cache(key)
            if op == "get":
                t, got = timed(lambda: s.get(key))
            else:
                t, got = timed(lambda: (lambda g: (touch(g), g))(s.get(key)))
            del got
        else:  # resolve
            p = s.proxy(obj)
            key = sys_.get_key(p)
            sys_.clear_cache(key)
            t, _ = timed(lambda: sys_.resolve(p))
            del p
        times.append(t)
        if key is not None:
            s.evict(key)
        if len(obj) >= (64 << 20):
            gc.collect()
    return times


# -- executor round trip -------------------------------------------------------

def add_one(x):
    return x + 1


def ps_add_one(p):
    from proxystore.proxy import extract
    from proxystore.store import get_store

    y = extract(p) + 1
    return get_store(p).proxy(y, evict=True)


def bench_executor(systems, reps, ctx):
    import xsilo.proxystore as xp

    x = numpy.arange((10 << 20) // 8, dtype=numpy.float64)
    expect = float(x.sum() + len(x))
    out = {}
    pool = ProcessPoolExecutor(1, mp_context=ctx)
    try:
        pool.submit(add_one, 1).result()  # the worker is up
        for sys_ in systems:
            out[sys_.name] = []
        for _ in range(reps + 1):  # the first round of each is a warm-up
            for sys_ in systems:
                s = sys_.store
                if sys_.name == "xsilo":
                    ex = xp.StoreExecutor(pool, s, should_proxy=xp.ProxySize(1 << 20))
                    t, r = timed(lambda: float(numpy.sum(ex.submit(add_one, x).result())))
                else:
                    def run():
                        p = s.proxy(x, evict=True)
                        r = pool.submit(ps_add_one, p).result()
                        return float(numpy.sum(sys_.extract(r)))

                    t, r = timed(run)
                assert r == expect, (sys_.name, r, expect)
                out[sys_.name].append(t)
        for name in out:
            out[name] = out[name][1:]
    finally:
        pool.shutdown()
    return out


def attribute_access():
    """ns per attribute read: a plain object, resolved proxies of each system."""
    import proxystore.proxy as psp

    import xsilo.proxy as xsp

    class Obj:
        def __init__(self):
            self.x = 1

    o = Obj()
    xp = xsp.Proxy(lambda: o)
    pp = psp.Proxy(lambda: o)
    xp.x, pp.x  # resolve
    n = 1_000_000
    out = {}
    for name, obj in (("plain object", o), ("xsilo proxy", xp), ("proxystore proxy", pp)):
        t = min(timeit.repeat("obj.x", globals={"obj": obj}, number=n, repeat=7))
        out[name] = t / n * 1e9
    return out


def fmt(cell):
    if "error" in cell:
        return f"failed ({cell['error'][:60]})"
    return f"{cell['median_s'] * 1e3:10.3f} ms"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--proxystore", default="/tmp/proxystore-0.6.5",
                    help="ProxyStore 0.6.5 source tree (git archive of tag v0.6.5)")
    ap.add_argument("--sizes", default=",".join(SIZES))
    ap.add_argument("--kinds", default="bytes,numpy")
    ap.add_argument("--connectors", default="file,redis")
    ap.add_argument("--ops", default="put,get,get+touch,resolve")
    ap.add_argument("--executor-reps", type=int, default=10)
    ap.add_argument("--no-baseline", dest="baseline", action="store_false",
                    help="leave out the baseline (the bytes alone, moved once: BaselineStore)")
    ap.add_argument("--reps-scale", type=float, default=1.0)
    ap.add_argument("--dir", default=None, help="where the file stores live (default: a tmp dir)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.dirname(
                        os.path.abspath(__file__))), "results", "proxystore_compare",
                        "proxystore_compare.json"))
    args = ap.parse_args()

    version = import_proxystore(args.proxystore)
    import xsilo

    root = tempfile.mkdtemp(prefix="pscmp-", dir=args.dir)
    redis_proc, redis_port = start_redis()
    ctx = multiprocessing.get_context("forkserver")
    rows, executor = [], {}
    try:
        for connector in args.connectors.split(","):
            systems = [proxystore_system(connector, root, redis_port, connector),
                       xsilo_system(connector, root, redis_port, connector)]
            if args.baseline:
                systems.append(baseline_system(connector, root, redis_port))
            for kind in args.kinds.split(","):
                for size_name in args.sizes.split(","):
                    obj = make_object(kind, SIZES[size_name])
                    reps = max(1, int(REPS[size_name] * args.reps_scale))
                    for op in args.ops.split(","):
                        times = {s.name: [] for s in systems}
                        errors = {}
                        # alternate the systems, one repetition at a time
                        for _ in range(reps):
                            for sys_ in systems:
                                if sys_.name in errors:
                                    continue
                                try:
                                    times[sys_.name] += bench_cell(sys_, op, obj, 1)
                                except Exception as e:  # noqa: BLE001 - reported in the table
                                    errors[sys_.name] = f"{type(e).__name__}: {e}"
                                    gc.collect()
                        row = {"connector": connector, "kind": kind, "size": size_name, "op": op,
                               "reps": reps}
                        for name, ts in times.items():
                            if name in errors:
                                row[name] = {"error": errors[name]}
                            else:
                                row[name] = {"median_s": statistics.median(ts), "min_s": min(ts)}
                        ok = "proxystore" not in errors and "xsilo" not in errors
                        row["speedup"] = (row["proxystore"]["median_s"] / row["xsilo"]["median_s"]
                                          if ok else None)
                        rows.append(row)
                        base = f"  baseline {fmt(row['baseline'])}" if "baseline" in row else ""
                        print(f"{connector:5} {kind:5} {size_name:>5} {op:9} "
                              f"proxystore {fmt(row['proxystore'])}  xsilo {fmt(row['xsilo'])}  "
                              f"{row['speedup'] or 0:7.2f}x{base}", flush=True)
                    del obj
                    gc.collect()
            ex = bench_executor(systems[:2], args.executor_reps, ctx)
            executor[connector] = {name: {"median_s": statistics.median(ts), "min_s": min(ts),
                                          "reps": len(ts)} for name, ts in ex.items()}
            executor[connector]["speedup"] = (executor[connector]["proxystore"]["median_s"] /
                                              executor[connector]["xsilo"]["median_s"])
            print(f"{connector:5} executor 10MB round trip: proxystore "
                  f"{executor[connector]['proxystore']['median_s'] * 1e3:.2f} ms, xsilo "
                  f"{executor[connector]['xsilo']['median_s'] * 1e3:.2f} ms, "
                  f"{executor[connector]['speedup']:.2f}x", flush=True)
            for sys_ in systems:
                sys_.store.close()
        attrs = attribute_access()
    finally:
        redis_proc.terminate()
        redis_proc.wait()
        shutil.rmtree(root, ignore_errors=True)

    print()
    print("| connector | object | size | op | ProxyStore 0.6.5 ms | xsilo ms | xsilo speedup | target "
          "| baseline ms | ProxyStore / baseline | xsilo / baseline |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")

    def over_baseline(r, n):
        if "baseline" not in r or "error" in r["baseline"] or "error" in r[n]:
            return "-"
        return f"{r[n]['median_s'] / r['baseline']['median_s']:.2f}"

    for r in rows:
        target = 3.0 if SIZES[r["size"]] >= (1 << 20) else 1.0
        cells = [("-" if n not in r else "failed" if "error" in r[n]
                  else f"{r[n]['median_s'] * 1e3:.3f}") for n in ("proxystore", "xsilo", "baseline")]
        if r["speedup"] is None:
            speed, met = "-", "n/a"
        else:
            speed = f"{r['speedup']:.2f}x"
            met = "met" if r["speedup"] >= target else "**missed**"
        print(f"| {r['connector']} | {r['kind']} | {r['size']} | {r['op']} | {cells[0]} | "
              f"{cells[1]} | {speed} | {met} (>= {target:g}x) | {cells[2]} | "
              f"{over_baseline(r, 'proxystore')} | {over_baseline(r, 'xsilo')} |")
    for c, e in executor.items():
        met = "met" if e["speedup"] >= 3 else "**missed**"
        print(f"| {c} | numpy | 10MB | executor round trip | {e['proxystore']['median_s'] * 1e3:.3f} "
              f"| {e['xsilo']['median_s'] * 1e3:.3f} | {e['speedup']:.2f}x | {met} (>= 3x) |")
    print()
    print("| attribute read of a resolved proxy | ns |")
    print("|---|---|")
    for k, v in attrs.items():
        print(f"| {k} | {v:.1f} |")

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    result = {"date": datetime.datetime.utcnow().isoformat(timespec="seconds") + "Z",
              "commit": commit, "host": platform.node(), "cpus": os.cpu_count(),
              "proxystore_version": version, "xsilo_version": xsilo.__version__,
              "argv": sys.argv[1:], "rows": rows, "executor_10MB": executor,
              "attribute_read_ns": attrs}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
