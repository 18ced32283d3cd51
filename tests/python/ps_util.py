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

    def __init__(self, password=None):
        if shutil.which("redis-server") is None:
            raise RuntimeError("cannot start redis-server (install Debian's redis-server)")
        # A free port another test's server took first (tests run two at
        # once) makes ours exit: another port then.
        for _ in range(5):
            self.port = free_port()
            self.proc = subprocess.Popen(
                ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--proto-max-bulk-len", "536870912", "--loglevel",
                 "warning"] + (["--requirepass", password] if password else []),
                stdout=subprocess.DEVNULL)
            if self._wait_ours(password):
                return
        raise RuntimeError("redis-server did not come up on a free port in 5 tries")

    def _wait_ours(self, password=None):
        """True once our redis-server answers on the port (INFO names its
        process id); False when it exited first."""
        deadline = time.monotonic() + 60
        while self.proc.poll() is None:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as c:
                    if password:
                        pw = password.encode()
                        c.sendall(b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n" % (len(pw), pw))
                    c.sendall(b"*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n")
                    reply = b""
                    while b"process_id:" not in reply or not reply.endswith(b"\r\n"):
                        chunk = c.recv(65536)
                        if not chunk:
                            break
                        reply += chunk
                if b"process_id:%d\r\n" % self.proc.pid in reply:
                    return True
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not come up on port {self.port}")
            time.sleep(0.02)
        return False

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
