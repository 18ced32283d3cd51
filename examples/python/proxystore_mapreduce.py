"""Map-reduce over 64 tasks of 10 MB inputs through a process pool.

StoreExecutor puts each 10 MB input in a file store and sends the worker a
proxy (a few hundred bytes); the worker resolves it (an mmap of the stored
file, no copy), computes a partial result, and the input is evicted as
soon as its task finishes. The reduce runs here.

    PYTHONPATH=build/python /usr/bin/python3 examples/python/proxystore_mapreduce.py
"""

import argparse
import multiprocessing
import os
import pickle
import shutil
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor

import numpy

import xsilo.proxystore as ps


def partial(chunk):
    """The map: sum and sum of squares of one input."""
    return float(numpy.sum(chunk)), float(numpy.dot(chunk, chunk)), len(chunk)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=64)
    ap.add_argument("--mb", type=float, default=10)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--dir", default=None, help="store directory (default: a temporary one)")
    args = ap.parse_args()

    root = args.dir or tempfile.mkdtemp(prefix="xsilo-mapreduce-")
    store = ps.Store("mapreduce", ps.FileConnector(root), register=True)
    n = int(args.mb * (1 << 20)) // 8
    inputs = [numpy.full(n, i % 7, dtype=numpy.float64) for i in range(args.tasks)]
    ctx = multiprocessing.get_context("forkserver")
    t0 = time.perf_counter()
    with ps.StoreExecutor(ProcessPoolExecutor(args.workers, mp_context=ctx), store,
                          should_proxy=ps.ProxySize(1 << 20)) as ex:
        sent = pickle.dumps(store.proxy(inputs[0]))  # what one task's argument weighs
        futures = [ex.submit(partial, x) for x in inputs]
        parts = [f.result() for f in futures]
    elapsed = time.perf_counter() - t0
    total = sum(p[0] for p in parts)
    squares = sum(p[1] for p in parts)
    count = sum(p[2] for p in parts)
    expect = sum(float(i % 7) * n for i in range(args.tasks))
    assert total == expect, (total, expect)
    ps.get_store("mapreduce").evict(ps.get_key(pickle.loads(sent)))
    left = os.listdir(root)
    print(f"{args.tasks} tasks x {args.mb:g} MB through {args.workers} processes: "
          f"{elapsed:.2f}s, mean {total / count:.4f}, mean square {squares / count:.4f}")
    print(f"each task's argument crossed as {len(sent)} bytes; objects left in the store: "
          f"{len(left)}")
    store.close()
    if args.dir is None:
        shutil.rmtree(root)
    return 0 if not left else 1


if __name__ == "__main__":
    raise SystemExit(main())
