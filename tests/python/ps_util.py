"""Helpers of the ProxyStore-API tests: a redis-server per test session
(started like tests/store/redis_server.cpp), and the functions run in
child processes (importable by name, so spawn/forkserver children find them)."""

import os
import shutil
import socket
import subprocess
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """redis-server on a free loopback port; stop() ends it."""

    def __init__(self):
        if shutil.which("redis-server") is None:
            raise RuntimeError("cannot start redis-server (install Debian's redis-server)")
        self.port = free_port()
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--proto-max-bulk-len", "536870912", "--loglevel",
             "warning"], stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:  # readiness: the port accepts a connection
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not come up on port {self.port}")
                time.sleep(0.02)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)


# -- run in child processes ---------------------------------------------------

def double(x):
    return x * 2


def array_sum(x):
    import numpy

    return float(numpy.sum(x))


def concat(a, b):
    import numpy

    return numpy.concatenate([a, b])


def consume(make_subscriber, sub_args, out_queue, ready, evict=None):
    """A stream consumer: builds its subscriber, says it is ready, then sends
    back (topic, sum or len, metadata) for every object until end of stream."""
    import numpy

    from xsilo import stream

    try:
        sub = getattr(stream, make_subscriber)(*sub_args)
        ready.set()
        consumer = stream.StreamConsumer(sub, evict=evict)
        got = []
        for topic, p, meta in consumer.iter_with_metadata():
            got.append((topic, float(numpy.sum(p)), meta))
        consumer.close()
        out_queue.put(("ok", got))
    except BaseException as e:  # noqa: BLE001 - reported to the test
        ready.set()
        out_queue.put(("error", repr(e)))


def produce(make_publisher, pub_args, store_config, topics, n, batch_size, evict):
    """A stream producer in its own process: n arrays per topic, then end."""
    import numpy

    from xsilo import pstore, stream

    pub = getattr(stream, make_publisher)(*pub_args)
    if hasattr(pub, "wait_for_subscribers"):
        pub.wait_for_subscribers(2 * len(topics), timeout=300)
    store = pstore.Store.from_config(store_config)
    prod = stream.StreamProducer(pub, {None: store}, batch_size=batch_size)
    for i in range(n):
        for t in topics:
            prod.send(t, numpy.full(1000, i, dtype=numpy.float64), evict=evict,
                      metadata={"i": i})
    prod.close(topics=topics)


def resolve_pickled(path):
    """Loads a pickled proxy from path in a fresh process and prints its sum."""
    import pickle

    import numpy

    with open(path, "rb") as f:
        p = pickle.load(f)
    print(float(numpy.sum(p["a"])), p["name"], len(p))


def set_pickled_future(path):
    """Loads a pickled future from path in a fresh process and sets it to
    an array of 1 << 20 twos (8 MB)."""
    import pickle

    import numpy

    with open(path, "rb") as f:
        fut = pickle.load(f)
    fut.set_result({"a": numpy.full(1 << 20, 2.0), "from": os.getpid()})
    print("set")


if __name__ == "__main__":
    import sys

    if sys.argv[1] == "set-future":
        set_pickled_future(sys.argv[2])
    else:
        resolve_pickled(sys.argv[1])
    os._exit(0)
