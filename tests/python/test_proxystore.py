"""The ProxyStore-shaped API (xsilo.proxystore): transparent proxies of any
object, the Store over native and Python connectors, ownership, lifetimes,
futures, and the errors of bad inputs."""

import json
import os
import pickle
import subprocess
import sys
import threading

import numpy
import pytest
import torch

import xsilo
import xsilo.proxystore as ps
from ps_util import RedisServer

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def store(tmp_path):
    s = ps.Store(f"ps-{tmp_path.name}", ps.FileConnector(str(tmp_path / "objects")),
                 register=True)
    yield s
    s.close()


@pytest.fixture(scope="module")
def redis_port():
    server = RedisServer()
    yield server.port
    server.stop()


class Point:
    """A user class: proxies of it answer its methods, operators and isinstance."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def norm2(self):
        return self.x * self.x + self.y * self.y

    def __add__(self, other):
        return Point(self.x + other.x, self.y + other.y)

    def __eq__(self, other):
        return (self.x, self.y) == (other.x, other.y)

    def __hash__(self):
        return hash((self.x, self.y))

    def __enter__(self):
        return "entered"

    def __exit__(self, *exc):
        return False


def test_numpy_array_passes_through_code_that_knows_no_proxies(store):
    a = numpy.arange(1 << 20, dtype=numpy.float32)
    p = store.proxy(a)
    assert not ps.is_resolved(p)
    assert isinstance(p, numpy.ndarray)
    assert ps.is_resolved(p)  # isinstance asks the target's class
    assert numpy.sum(p) == numpy.sum(a)
    assert p.shape == a.shape and p.dtype == a.dtype
    assert numpy.array_equal(p * 2, a * 2)
    assert len(p) == len(a) and p[7] == 7
    # out of band: the array views the fetched bytes (read-only), not a copy
    assert not ps.extract(p).flags.owndata


def test_dict_json_iteration_and_hashing(store):
    d = {"name": "model", "layers": [1, 2, 3], "lr": 0.5}
    p = store.proxy(d)
    assert json.dumps(p) == json.dumps(d)
    assert json.dumps({"outer": p}) == json.dumps({"outer": d})
    assert isinstance(p, dict) and p == d and len(p) == 3
    assert sorted(p) == sorted(d) and p["layers"][2] == 3
    assert "lr" in p
    h = store.proxy("a string key")
    assert hash(h) == hash("a string key") and {h: 1}["a string key"] == 1


def test_user_class_operators_and_with(store):
    p = store.proxy(Point(3, 4))
    assert isinstance(p, Point)
    assert p.norm2() == 25 and p.x == 3
    assert p + Point(1, 1) == Point(4, 5)
    assert hash(p) == hash(Point(3, 4))
    with p as entered:
        assert entered == "entered"
    ints = store.proxy([5, 6, 7])
    assert list(iter(ints)) == [5, 6, 7] and sum(ints) == 18 and ints[-1] == 7


def test_torch_tensor(store):
    t = torch.arange(1000, dtype=torch.float32).reshape(10, 100)
    p = store.proxy(t)
    assert isinstance(p, torch.Tensor)
    assert torch.equal(torch.sum(p), torch.sum(t))
    assert torch.equal(p + 1, t + 1)
    assert torch.equal(torch.cat([p, p]), torch.cat([t, t]))
    assert p.shape == (10, 100) and p.dtype == torch.float32
    bf = store.proxy({"w": torch.ones(4, dtype=torch.bfloat16), "g": torch.zeros(2).requires_grad_()})
    assert bf["w"].dtype == torch.bfloat16 and bf["g"].requires_grad


def test_lambdas_and_local_classes_go_through_cloudpickle(store):
    class Local:
        def value(self):
            return 41

    assert store.proxy(lambda x: x + 1)(1) == 2
    assert store.proxy(Local()).value() == 41


def test_bytes_inside_structures_round_trip(store):
    big = os.urandom(1 << 20)
    p = store.proxy({"blob": big, "small": b"abc", "arr": bytearray(big)})
    assert p["blob"] == big and type(p["blob"]) is bytes
    assert p["small"] == b"abc" and bytes(p["arr"]) == big
    # the large ones leave the pickle stream (out of band, not copied into it)
    stream, buffers = ps.serialize_parts({"blob": big, "arr": bytearray(big), "n": [big]})
    assert len(stream) < 1024 and sorted(b.nbytes for b in buffers) == [1 << 20] * 3


def test_resolves_once_across_threads(tmp_path):
    entered, release = threading.Event(), threading.Event()

    class Slow(ps.LocalConnector):
        gets = 0

        def get(self, key):
            Slow.gets += 1
            entered.set()
            assert release.wait(300)
            return super().get(key)

    s = ps.Store("slow", Slow(), cache_size=0)
    p = s.proxy(list(range(100)))
    results = []
    threads = [threading.Thread(target=lambda: results.append(sum(p))) for _ in range(16)]
    for t in threads:
        t.start()
    assert entered.wait(300)
    release.set()
    for t in threads:
        t.join(300)
    assert results == [4950] * 16
    assert Slow.gets == 1


def test_pickles_to_a_small_reference_that_resolves_in_another_process(store, tmp_path):
    a = numpy.ones(1 << 20)  # 8 MB
    p = store.proxy({"a": a, "name": "ones"})
    blob = pickle.dumps(p)
    assert len(blob) < 1024
    assert not ps.is_resolved(p)  # pickling did not resolve it
    path = tmp_path / "proxy.pkl"
    path.write_bytes(blob)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [HERE, env.get("PYTHONPATH")]))
    out = subprocess.run([sys.executable, os.path.join(HERE, "ps_util.py"), str(path)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(float(1 << 20)), "ones", "2"]


def test_helpers_and_locker(store):
    p = store.proxy({"k": 1})
    key = ps.get_key(p)
    assert store.exists(key) and not ps.is_resolved(p)
    assert ps.resolve_async(p).result(300) is None and ps.is_resolved(p)
    assert ps.extract(p) == {"k": 1} and type(ps.extract(p)) is dict
    locked = store.locked_proxy([1, 2])
    with pytest.raises(ps.ProxyLockedError):
        locked.append(3)
    assert ps.is_proxy(locked.unlock()) and locked.unlock() == [1, 2]
    assert pickle.loads(pickle.dumps(locked)).unlock() == [1, 2]
    with pytest.raises(TypeError):
        ps.extract([1])
    assert ps.get_key([1]) is None


def test_resolved_proxy_reads_the_target_directly_and_keeps_its_own_names():
    """The fast attribute read (python/src/fastproxy.cpp) is the proxy type
    in this build, and it changes no meaning: the target's attributes,
    methods and class attributes, the proxy's own names (__wrapped__,
    __class__, __reduce__, its factory), attributes set through the proxy,
    and an unresolved proxy that resolves on its first read."""
    from xsilo import _fastproxy
    from xsilo.proxy import Proxy

    assert Proxy.__mro__[1] is _fastproxy.FastProxy

    class Target:
        kind = "class attribute"

        def __init__(self):
            self.x = 5

        def twice(self):
            return 2 * self.x

    calls = []

    def make():
        calls.append(1)
        return Target()

    p = Proxy(make)
    assert not ps.is_resolved(p)
    assert p.x == 5 and calls == [1]  # the first read resolves, once
    assert p.twice() == 10 and p.kind == "class attribute" and calls == [1]
    assert p.__class__ is Target and isinstance(p, Target)
    assert type(p.__wrapped__) is Target and p.__reduce__()[0].__name__ == "_rebuild_proxy"
    p.y = 7
    assert p.y == 7 and ps.extract(p).y == 7
    with pytest.raises(AttributeError):
        p.missing  # noqa: B018


def test_store_api(store):
    k = store.put({"x": 1})
    assert store.get(k) == {"x": 1} and store.is_cached(k)
    keys = store.put_batch([1, "two", [3]])
    assert [store.get(k) for k in keys] == [1, "two", [3]]
    store.evict(keys[0])
    assert not store.exists(keys[0]) and store.get(keys[0], default="gone") == "gone"
    proxies = store.proxy_batch([b"a", b"b"])
    assert [bytes(p) for p in proxies] == [b"a", b"b"]
    assert store.proxy_from_key(keys[1]) == "two"
    evicting = store.proxy("once", evict=True)
    assert evicting == "once" and not store.exists(ps.get_key(evicting))
    rebuilt = ps.Store.from_config(store.config())
    assert rebuilt.get(k) == {"x": 1}
    assert ps.get_store(store.name) is store
    engine_written = store.connector.put(ps.serialize({"small": 1}))  # read back by one read()
    assert store.get(engine_written) == {"small": 1}
    store.evict(engine_written)
    assert store.get(engine_written, default="gone") == "gone"
    custom = store.put({"y": 2}, serializer=lambda o: json.dumps(o).encode())
    assert store.get(custom, deserializer=json.loads) == {"y": 2}


def test_registry():
    s = ps.Store("registry-test", ps.LocalConnector())
    assert ps.get_store("registry-test") is None
    ps.register_store(s)
    assert ps.get_store("registry-test") is s
    with pytest.raises(ps.StoreExistsError):
        ps.register_store(ps.Store("registry-test", ps.LocalConnector()))
    ps.unregister_store("registry-test")
    assert ps.get_store("registry-test") is None


def test_metrics(tmp_path):
    s = ps.Store("metrics", ps.FileConnector(str(tmp_path)), metrics=True)
    k = s.put(1)
    s.get(k)
    m = s.metrics.summary()
    assert m["put"]["count"] == 1 and m["get"]["count"] == 1


def test_connector_written_in_python_plugs_into_the_store():
    class DictConnector(ps.Connector):
        def __init__(self):
            self.data = {}

        def put(self, data):
            key = f"k{len(self.data)}"
            self.data[key] = bytes(data)
            return key

        def get(self, key):
            return self.data.get(key)

        def exists(self, key):
            return key in self.data

        def evict(self, key):
            self.data.pop(key, None)

        def config(self):
            return {}

    conn = DictConnector()
    s = ps.Store("python-connector", conn, register=True)
    try:
        p = s.proxy({"arr": numpy.arange(100000)})
        assert len(conn.data) == 1 and int(numpy.sum(p["arr"])) == 4999950000
    finally:
        s.close()


def test_native_connector_protocol(tmp_path, redis_port):
    for conn in (ps.FileConnector(str(tmp_path)), ps.MemoryConnector("proto"),
                 ps.RedisConnector("127.0.0.1", redis_port)):
        k = conn.put(b"payload")
        assert conn.get(k) == b"payload" and conn.exists(k)
        assert conn.get_batch(conn.put_batch([b"a", b"b"])) == [b"a", b"b"]
        conn.evict(k)
        assert not conn.exists(k) and conn.get(k) is None
        again = type(conn).from_config(conn.config())
        assert again.get(again.put(b"z")) == b"z"
        conn.close()


def test_redis_and_multi_connectors(tmp_path, redis_port):
    small = ps.FileConnector(str(tmp_path / "small"))
    big = ps.RedisConnector("127.0.0.1", redis_port)
    multi = ps.MultiConnector({"small": (small, ps.Policy(max_size_bytes=4096, priority=1)),
                               "big": (big, ps.Policy())})
    s = ps.Store("multi", multi, register=True)
    try:
        a = s.proxy(numpy.ones(100000))
        b = s.proxy([1, 2])
        assert numpy.sum(a) == 100000 and b == [1, 2]
        assert "big" in ps.get_key(a) and "small" in ps.get_key(b)
        assert pickle.loads(pickle.dumps(a)).shape == (100000,)
    finally:
        s.close()


def test_ownership(store):
    owned = store.owned_proxy([1, 2, 3])
    key = ps.get_key(owned)
    ref = ps.borrow(owned)
    assert ref == [1, 2, 3]
    with pytest.raises(ps.MutableBorrowError):
        ps.mut_borrow(owned)
    del ref
    mut = ps.mut_borrow(owned)
    with pytest.raises(ps.MutableBorrowError):
        ps.borrow(owned)
    del mut
    copy = ps.clone(owned)
    assert copy == [1, 2, 3] and ps.get_key(copy) != key
    with pytest.raises(ps.ReferenceNotOwnedError):
        ps.borrow(store.proxy(1))
    del owned
    assert not store.exists(key)
    plain = store.proxy("mine")
    k2 = ps.get_key(plain)
    taken = ps.into_owned(plain)
    del taken
    assert not store.exists(k2)


def test_lifetimes(store):
    with ps.ContextLifetime(store) as life:
        k = store.put(1, lifetime=life)
        p = store.proxy(2, lifetime=life)
        assert store.exists(k)
    assert life.done() and not store.exists(k) and not store.exists(ps.get_key(p))
    with pytest.raises(RuntimeError):
        life.add_key(k)
    lease = ps.LeaseLifetime(store, expiry=3600)
    k = store.put(3, lifetime=lease)
    lease.extend(7200)
    assert store.exists(k)
    lease.close()
    assert lease.done() and not store.exists(k)
    assert ps.StaticLifetime() is ps.StaticLifetime()


def test_future_over_a_python_connector():
    s = ps.Store("futures", ps.LocalConnector(), register=True)
    try:
        f = s.future()
        p = f.proxy(timeout=300)
        assert not f.done()
        t = threading.Thread(target=f.set_result, args=({"done": True},))
        t.start()
        assert p["done"] is True
        t.join(300)
        with pytest.raises(TimeoutError):
            s.future().result(timeout=0)
    finally:
        s.close()


def test_file_objects_of_bytes_are_read_into_their_bytes_objects(tmp_path):
    # Objects whose buffers all come from bytes objects are read with
    # pread() straight into the bytes they become (the 16 MiB one through
    # the extension, into huge pages); others go through the engine's mmap.
    s = ps.Store(f"reads-{tmp_path.name}", ps.FileConnector(str(tmp_path / "objects")),
                 cache_size=0)
    try:
        engine_gets = lambda: s._native.metrics()["get"]["count"]  # noqa: E731
        big, mid = os.urandom(16 << 20), os.urandom(1 << 20)
        k1, k2 = s.put(big), s.put({"a": mid, "b": big, "n": 1})
        assert s.get(k1) == big and type(s.get(k1)) is bytes
        assert s.get(k2) == {"a": mid, "b": big, "n": 1}
        assert engine_gets() == 0
        k3 = s.put({"a": mid, "x": numpy.ones(1 << 17)})  # a numpy buffer: the engine's mmap
        got = s.get(k3)
        assert got["a"] == mid and numpy.sum(got["x"]) == 1 << 17 and engine_gets() == 1
        # A file cut short is refused, not handed on.
        path = tmp_path / "objects" / json.loads(k1)["id"]
        with open(path, "r+b") as f:
            f.truncate(path.stat().st_size - 100)
        with pytest.raises(ps.StoreError, match="shorter than its header"):
            s.get(k1)
        k4 = s.put(numpy.ones(1 << 17))  # no bytes objects: through the engine
        path = tmp_path / "objects" / json.loads(k4)["id"]
        with open(path, "r+b") as f:
            f.truncate(path.stat().st_size - 100)
        with pytest.raises(ps.SerializationError, match="truncated object"):
            s.get(k4)
    finally:
        s.close()


def test_bytes_from_and_pread_bytes(tmp_path):
    data = os.urandom((8 << 20) + 12345)
    assert xsilo._xsilo._bytes_from(memoryview(data)[5:]) == data[5:]
    assert xsilo._xsilo._bytes_from(numpy.frombuffer(data, numpy.uint8)) == data
    path = tmp_path / "f"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert xsilo._xsilo._pread_bytes(fd, len(data) - 7, 7) == data[7:]
        with pytest.raises(ValueError, match="file ends after"):
            xsilo._xsilo._pread_bytes(fd, len(data), 1)
    finally:
        os.close(fd)
    with pytest.raises(OSError):
        xsilo._xsilo._pread_bytes(fd, 10, 0)  # closed


def _connector(kind, tmp_path, redis_port):
    if kind == "file":
        return ps.FileConnector(str(tmp_path / "objects"))
    if kind == "redis-engine":
        return ps.RedisConnector("127.0.0.1", redis_port, wire=False, prefix=tmp_path.name)
    return ps.RedisConnector("127.0.0.1", redis_port, prefix=tmp_path.name)


@pytest.mark.parametrize("kind", ["file", "redis-engine", "redis-wire"])
def test_future_over_native_connectors_set_in_another_process(kind, tmp_path, redis_port):
    s = ps.Store(f"fut-{kind}-{tmp_path.name}", _connector(kind, tmp_path, redis_port),
                 register=True)
    try:
        f = s.future()
        assert json.loads(f.key)["size"] == 0  # the engine's deferred key
        assert not f.done()
        with pytest.raises(TimeoutError, match="not set within"):
            f.result(timeout=0)
        with pytest.raises(TimeoutError):
            f.result(timeout=0.05)
        # A waiter blocks in its own thread before the value exists.
        got = {}
        waiter = threading.Thread(target=lambda: got.update(v=f.result(timeout=300)))
        waiter.start()
        p = f.proxy(timeout=300)
        path = tmp_path / "future.pkl"
        blob = pickle.dumps(f)
        assert len(blob) < 1024
        path.write_bytes(blob)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [HERE, env.get("PYTHONPATH")]))
        out = subprocess.run([sys.executable, os.path.join(HERE, "ps_util.py"), "set-future",
                              str(path)], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        waiter.join(300)
        assert not waiter.is_alive()
        assert got["v"]["from"] != os.getpid() and float(numpy.sum(got["v"]["a"])) == 2 << 20
        assert float(numpy.sum(p["a"])) == 2 << 20  # the proxy waited for the same value
        assert f.done()
        # An engine-made deferred key and the Store's protocol: a second
        # set overwrites, and an evicted future's value is gone.
        f.set_result("again")
        assert f.result(timeout=0) == "again"
        s.evict(f.key)
        assert not f.done()
    finally:
        s.close()


def test_update_writes_a_mutable_borrow_back_over_a_native_connector(store):
    owned = store.owned_proxy([1, 2])
    m = ps.mut_borrow(owned)
    m.append(3)
    ps.update(m)
    assert store.get(ps.get_key(owned)) == [1, 2, 3]


def test_bad_inputs_raise_clear_errors(store):
    with pytest.raises(ps.SerializationError, match="cannot serialize 'lock'"):
        store.proxy(threading.Lock())
    k = store.put("here")
    store.evict(k)
    p = store.proxy_from_key(k)
    with pytest.raises(ps.ProxyResolveMissingKeyError, match="not in store"):
        len(p)
    with pytest.raises(TypeError, match="not a connector"):
        ps.Store("x", object())
    with pytest.raises(NotImplementedError, match="deferred keys: Plain has no new_key"):
        ps.Store("no-futures", type("Plain", (), {"put": 0, "get": 0})()).future()
    with pytest.raises(ValueError, match="timeout must be"):
        store.future().result(timeout=-1)
    store.close()
    with pytest.raises(ps.StoreClosedError, match="is closed"):
        store.put(1)
    with pytest.raises(ps.StoreClosedError):
        store.get(k)


def test_the_existing_store_api_is_unchanged(tmp_path):
    s = xsilo.Store(f"legacy-{tmp_path.name}", connector="file", options={"dir": str(tmp_path)})
    try:
        p = s.proxy(b"bytes")
        assert bytes(p.resolve()) == b"bytes"
    finally:
        s.close()


@pytest.mark.parametrize("part_bytes", [None, 1000])
def test_redis_store_and_engine_share_one_layout(redis_port, part_bytes):
    """The Store's Redis path (xsilo._redis_wire) and the engine's redis
    connector read each other's objects, in one part or many."""
    kw = {} if part_bytes is None else {"part_bytes": part_bytes}
    s = ps.Store(f"wire-{part_bytes}", ps.RedisConnector("127.0.0.1", redis_port, **kw))
    try:
        a = numpy.arange(100000.0)
        k = s.put({"a": a, "b": b"x" * 200000})
        got = s.get(k)
        assert numpy.array_equal(got["a"], a) and got["b"] == b"x" * 200000
        assert got["a"].flags.writeable  # read into a buffer of its own
        assert ps.deserialize(s.connector.get(k))["b"] == b"x" * 200000  # the engine reads it
        k2 = s.connector.put(ps.serialize([1, a]))  # the engine writes
        assert numpy.array_equal(s.get(k2)[1], a)
        s.evict(k)
        assert not s.exists(k) and s.get(k) is None and s.connector.get(k) is None
        assert s.get(s.put(b"tiny")) == b"tiny"
        big = os.urandom((8 << 20) + 3)  # rebuilt by the extension (_bytes_from)
        assert s.get(s.put(big)) == big
        engine_only = ps.Store(f"engine-{part_bytes}",
                               ps.RedisConnector("127.0.0.1", redis_port, wire=False, **kw))
        assert engine_only._wire is None and numpy.array_equal(engine_only.get(k2)[1], a)
    finally:
        s.close()


def test_a_redis_password_travels_in_no_reference(tmp_path):
    """A Store over a redis that wants AUTH: neither the connector's config
    nor a pickled proxy carries the password. Another process resolves the
    proxy with the password in REDISCLI_AUTH (or password_file), as a
    receiving site keeps its own; without it, the error says NOAUTH."""
    password = "py-redis-password-7e2a"
    server = RedisServer(password=password)
    s = ps.Store(f"auth-{tmp_path.name}", ps.RedisConnector("127.0.0.1", server.port,
                                                          password=password), register=True)
    try:
        assert password not in json.dumps(s.connector.config())
        p = s.proxy(numpy.arange(1000.0))
        blob = pickle.dumps(p)
        assert password.encode() not in blob
        code = ("import pickle, sys, numpy, xsilo.proxystore as ps\n"
                "p = pickle.loads(sys.stdin.buffer.read())\n"
                "print(float(numpy.sum(p)))\n")
        env = {k: v for k, v in os.environ.items() if k != "REDISCLI_AUTH"}
        ok = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True,
                            env=dict(env, REDISCLI_AUTH=password), timeout=120)
        assert ok.returncode == 0, ok.stderr.decode()
        assert float(ok.stdout) == float(numpy.sum(numpy.arange(1000.0)))
        refused = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True,
                                 env=env, timeout=120)
        assert refused.returncode != 0 and b"NOAUTH" in refused.stderr, refused.stderr.decode()
        secret = tmp_path / "redis-password"
        secret.write_text(password + "\n")
        secret.chmod(0o600)
        c = ps.RedisConnector("127.0.0.1", server.port, password_file=str(secret))
        assert str(secret) in json.dumps(c.config()) and password not in json.dumps(c.config())
    finally:
        s.close()
        server.stop()
