"""A FaaS-style call where only keys cross: the function service is another
process, and the request and the reply are proxies of objects in a Redis
or file store (a few hundred bytes each), whatever the size of the data.

    PYTHONPATH=build/python /usr/bin/python3 examples/python/proxystore_faas.py
    PYTHONPATH=build/python /usr/bin/python3 examples/python/proxystore_faas.py \
        --redis 127.0.0.1:6379
"""

import argparse
import multiprocessing
import pickle
import shutil
import tempfile

import numpy

import xsilo.proxystore as ps


def normalize(x):
    return (x - x.mean()) / x.std()


FUNCTIONS = {"normalize": normalize}


def service(conn):
    """The function service: receives (name, pickled args), replies with a
    pickled proxy of the result. It never sees the data's bytes on the pipe."""
    while True:
        request = conn.recv_bytes()
        if not request:
            return
        name, args, store_config = pickle.loads(request)
        result = FUNCTIONS[name](*args)  # args are proxies: resolved here
        store = ps.get_store(store_config["name"]) or ps.Store.from_config(store_config)
        ps.register_store(store, exist_ok=True)
        conn.send_bytes(pickle.dumps(store.proxy(result, evict=True)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=100)
    ap.add_argument("--redis", default=None, help="host:port of a Redis server (default: files)")
    args = ap.parse_args()
    root = None
    if args.redis:
        host, port = args.redis.rsplit(":", 1)
        connector = ps.RedisConnector(host, int(port))
    else:
        root = tempfile.mkdtemp(prefix="xsilo-faas-")
        connector = ps.FileConnector(root)
    store = ps.Store("faas", connector, register=True)

    ctx = multiprocessing.get_context("forkserver")
    mine, theirs = ctx.Pipe()
    worker = ctx.Process(target=service, args=(theirs,))
    worker.start()
    x = numpy.random.default_rng(0).normal(5.0, 2.0, int(args.mb * (1 << 20)) // 8)
    arg = store.proxy(x, evict=True)
    request = pickle.dumps(("normalize", (arg,), store.config()))
    mine.send_bytes(request)
    reply = mine.recv_bytes()
    result = pickle.loads(reply)
    print(f"request {len(request)} bytes, reply {len(reply)} bytes for {x.nbytes >> 20} MB "
          f"in and out")
    print(f"result mean {float(result.mean()):+.6f}, std {float(result.std()):.6f}")
    mine.send_bytes(b"")
    worker.join(60)
    store.close()
    if root:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
