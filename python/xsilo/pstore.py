"""A ProxyStore-shaped Store over the xsilo engine.

    from xsilo.proxystore import Store, FileConnector
    store = Store("data", FileConnector("/shared/data"), register=True)
    p = store.proxy({"weights": numpy_array, "step": 3})  # any picklable object
    pickle.dumps(p)            # a few hundred bytes: store config + key
    numpy.sum(p["weights"])    # in any process: resolves once, then forwards

Objects are serialized with pickle protocol 5, their large buffers out of
band (xsilo.serialize); with a native connector the parts go to the C++
engine as one gather write and come back as views of the fetched bytes
(an mmap for the file connector), so numpy arrays and torch tensors are
neither copied on put nor on get. Such arrays are read-only views, as
everywhere in xsilo. A connector written in Python gets one packed bytes
object per put.

The registry (register_store / get_store / unregister_store) holds the
stores of this process by name; a proxy resolves through the registered
store of its name, or builds one from the config it carries.
"""

import atexit
import importlib
import json
import os
import re
import threading
import time
import uuid
from collections import OrderedDict

from . import _xsilo
from . import serialize as _ser
from ._redis_wire import RedisWire
from .connectors import FileConnector, NativeConnector, RedisConnector, make_native_store
from .proxy import Factory, Proxy, ProxyLocker, is_proxy


class StoreError(RuntimeError):
    """Base of the errors of this module."""


class StoreExistsError(StoreError):
    """A store of that name is registered already."""


class StoreClosedError(StoreError):
    """The store was closed."""


class ProxyResolveMissingKeyError(StoreError, LookupError):
    """A proxy's key is not (or no longer) in its store."""


class ReferenceInvalidError(StoreError):
    """An ownership rule was broken (a borrow of a gone owner, ...)."""


class ReferenceNotOwnedError(StoreError, TypeError):
    """A borrow or clone of something that is not an OwnedProxy."""


class MutableBorrowError(StoreError):
    """A borrow while a mutable borrow exists, or a mutable borrow while any borrow does."""


# -- registry ---------------------------------------------------------------

_registry = {}  # name -> (pid, Store)
_registry_lock = threading.RLock()


def register_store(store, exist_ok=False):
    """Makes store findable by name in this process (get_store)."""
    with _registry_lock:
        cur = _registry.get(store.name)
        if cur is not None and cur[0] == os.getpid() and cur[1] is not store and not exist_ok:
            raise StoreExistsError(f"a store named {store.name!r} is registered already")
        _registry[store.name] = (os.getpid(), store)


def get_store(name_or_proxy):
    """The registered store of that name (or of that proxy's key), or None."""
    name = name_or_proxy
    if is_proxy(name_or_proxy):
        f = name_or_proxy.__factory__
        if not isinstance(f, StoreFactory):
            return None
        name = f.store_config["name"]
    with _registry_lock:
        cur = _registry.get(name)
        # After a fork the parent's engine objects are not this process's.
        if cur is None or cur[0] != os.getpid():
            return None
        return cur[1]


def unregister_store(name_or_store):
    name = name_or_store if isinstance(name_or_store, str) else name_or_store.name
    with _registry_lock:
        _registry.pop(name, None)


def _store_for(config):
    with _registry_lock:
        s = get_store(config["name"])
        if s is None:
            s = Store.from_config(config)
            register_store(s, exist_ok=True)
        return s


# -- metrics ----------------------------------------------------------------

class StoreMetrics:
    """Per-operation count and time (seconds) of a Store made with metrics=True."""

    def __init__(self):
        self._lock = threading.Lock()
        self._ops = {}

    def record(self, op, seconds):
        with self._lock:
            c, t = self._ops.get(op, (0, 0.0))
            self._ops[op] = (c + 1, t + seconds)

    def summary(self):
        with self._lock:
            return {op: {"count": c, "total_s": t, "avg_s": t / c} for op, (c, t) in
                    self._ops.items()}


class _Timed:
    __slots__ = ("m", "op", "t0")

    def __init__(self, m, op):
        self.m, self.op = m, op

    def __enter__(self):
        self.t0 = time.perf_counter()

    def __exit__(self, *exc):
        self.m.record(self.op, time.perf_counter() - self.t0)


class _NoTimer:
    def __enter__(self):
        pass

    def __exit__(self, *exc):
        pass


_NO_TIMER = _NoTimer()
_SMALL_FILE = 64 << 10
_FILE_ID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_-]{0,199}")
_MISSING = object()


def _class_path(cls):
    return f"{cls.__module__}.{cls.__qualname__}"


def _load_class(path):
    mod, _, name = path.rpartition(".")
    return getattr(importlib.import_module(mod), name)


# -- Store ------------------------------------------------------------------

class Store:
    """A named store over one connector (native or written in Python).

    cache_size: how many fetched objects are kept (LRU; 0 = none).
    metrics: record per-operation counts and times (store.metrics).
    register: add it to this process's registry (register_store).
    serializer / deserializer: bytes <-> object for every put / get instead
    of xsilo's pickle 5 (a callable pair, as in ProxyStore).
    """

    def __init__(self, name, connector, serializer=None, deserializer=None, cache_size=16,
                 metrics=False, populate_target=False, register=False):
        if not isinstance(name, str) or not name:
            raise ValueError("a store needs a non-empty name")
        if not hasattr(connector, "put") or not hasattr(connector, "get"):
            raise TypeError(f"not a connector: {type(connector).__name__}")
        if cache_size < 0:
            raise ValueError("cache_size must be >= 0")
        self.name = name
        self.connector = connector
        self.serializer = serializer
        self.deserializer = deserializer
        self.cache_size = int(cache_size)
        self.populate_target = populate_target
        self.metrics = StoreMetrics() if metrics else None
        self._cache = OrderedDict()
        self._cache_lock = threading.Lock()
        self._closed = False
        self._native = None
        self._wire = None
        self._file_dir = None
        if isinstance(connector, FileConnector):
            self._file_dir = connector.options["dir"]
        if isinstance(connector, RedisConnector) and connector.wire:
            self._wire = RedisWire(connector.options)
        elif isinstance(connector, NativeConnector):
            self._native = make_native_store(name, connector.type, connector.options, 0)
        if register:
            register_store(self)

    # config ---------------------------------------------------------------
    def config(self):
        """A small dict that rebuilds this store in any process (from_config)."""
        return {"name": self.name, "connector_type": _class_path(type(self.connector)),
                "connector_config": self.connector.config(), "cache_size": self.cache_size,
                "metrics": self.metrics is not None, "serializer": self.serializer,
                "deserializer": self.deserializer}

    @classmethod
    def from_config(cls, config):
        conn = _load_class(config["connector_type"]).from_config(config["connector_config"])
        return cls(config["name"], conn, serializer=config.get("serializer"),
                   deserializer=config.get("deserializer"),
                   cache_size=config.get("cache_size", 16), metrics=config.get("metrics", False))

    def _timer(self, op):
        return _NO_TIMER if self.metrics is None else _Timed(self.metrics, op)

    def _check(self):
        if self._closed:
            raise StoreClosedError(f"store {self.name!r} is closed")

    # bytes ----------------------------------------------------------------
    def _encode(self, obj, serializer):
        """obj in the form this store's path writes: a list of segments (the
        Redis path), a buffer or a dict of parts (the engine: put_bytes,
        put_tensors), or bytes (a connector written in Python)."""
        serializer = serializer or self.serializer
        if serializer is not None:
            data = serializer(obj)
            if self._wire is not None:
                return [data]
            return memoryview(data) if self._native is not None else data
        stream, buffers = _ser.dumps(obj)
        if self._wire is not None:
            return _ser.pack_segments(stream, buffers)
        if self._native is not None:
            if not buffers:  # one small part: a packed bytes object
                return memoryview(_ser.pack(stream, ()))
            return _ser.parts(stream, buffers)
        return _ser.pack(stream, buffers)

    def _put_one(self, obj, serializer):
        enc = self._encode(obj, serializer)
        if self._wire is not None:
            return self._wire.put(enc)
        if self._native is not None:
            if isinstance(enc, dict):
                return self._native.put_tensors(enc)
            return self._native.put_bytes(enc)
        return self.connector.put(enc)

    def _set_one(self, key, obj, serializer):
        """Writes obj under a deferred key (a future's) and wakes its waiters."""
        enc = self._encode(obj, serializer)
        if self._wire is not None:
            return self._wire.set(key, enc)
        if self._native is not None:
            if isinstance(enc, dict):
                return self._native.set_tensors(key, enc)
            return self._native.set_bytes(key, enc)
        return self.connector.set(key, enc)

    def _wait(self, key, timeout, first_poll=0.001):
        """True once key exists, False after timeout seconds. The engine and
        the Redis path wait on the setter's notification (redis) or poll;
        a Python connector is polled, 1 ms doubling to 500 ms."""
        self._check()
        if self._wire is not None:
            return self._wire.wait(key, timeout)
        if self._native is not None:
            return self._native.wait(key, int(timeout * 1000))
        deadline = time.monotonic() + timeout
        wait = first_poll
        while not self.connector.exists(key):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(wait, remaining))
            wait = min(wait * 2, 0.5)
        return True

    def _get_one(self, key, deserializer):
        deserializer = deserializer or self.deserializer
        if self._wire is not None:
            data = self._wire.get(key)
            if data is None:
                return _MISSING
            if deserializer is not None:
                return deserializer(data.tobytes())
            return _ser.loads(*_ser.unparts(data))
        if self._file_dir is not None and deserializer is None:
            small = self._read_file(key)
            if small is not None:
                return small
        if self._native is not None:
            if deserializer is not None:
                t = self._native.get_bytes(key)
                return _MISSING if t is None else deserializer(bytes(memoryview(t)))
            t = self._native.get_bytes(key)
            if t is None:
                return _MISSING
            return _ser.loads(*_ser.unparts(memoryview(t)))
        data = self.connector.get(key)
        if data is None:
            return _MISSING
        if deserializer is not None:
            return deserializer(data)
        return _ser.deserialize(data)

    def _read_file(self, key):
        """An object of the file connector read with read() where that beats
        the engine's mmap: a small one (up to 64 KiB) whole, with one read;
        a larger one whose buffers all came from bytes objects buffer by
        buffer, each read straight into the bytes object it becomes (one
        copy; through the mmap it is a copy plus a page fault per 4 KiB).
        None when neither applies (the engine reads it then)."""
        try:
            k = json.loads(key)
        except ValueError:
            return None
        id_ = k.get("id")
        if k.get("c") != "file" or not isinstance(id_, str) or not _FILE_ID.fullmatch(id_):
            return None
        try:
            fd = os.open(os.path.join(self._file_dir, id_), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return _MISSING
        try:
            # By the file's size, not the key's: set() may have rewritten it.
            first = os.read(fd, _SMALL_FILE + 1)
            if len(first) <= _SMALL_FILE:
                return _ser.loads(*_ser.unparts(first))
            size = os.fstat(fd).st_size
            if first[:4] == _ser._MAGIC:
                return None
            n = int.from_bytes(first[:8], "little")
            if n > 1 << 20:
                return None
            spans = _ser.bytes_parts(json.loads(first[8:8 + n] if 8 + n <= len(first)
                                                else os.pread(fd, n, 8)))
            if spans is None:
                return None
            base = 8 + n
            (ta, tb), (a, b), bufs = spans
            # Checked once here: an object file is only ever replaced whole
            # (rename), so the open file cannot shrink under the reads.
            if base + max(b, tb, max((e for _, e in bufs), default=0)) > size:
                raise StoreError(f"file object {id_} is shorter than its header says")
            if os.pread(fd, tb - ta, base + ta) != b"\x01" * (tb - ta):
                return None  # not all bytes objects: the engine maps it
            stream = os.pread(fd, b - a, base + a)
            buffers = [os.pread(fd, e - s, base + s) if e - s < _ser._HUGE_COPY
                       else _xsilo._pread_bytes(fd, e - s, base + s) for s, e in bufs]
            return _ser.loads(stream, buffers)
        finally:
            os.close(fd)

    # the API --------------------------------------------------------------
    def put(self, obj, serializer=None, lifetime=None):
        """Stores obj; returns its key."""
        self._check()
        with self._timer("put"):
            key = self._put_one(obj, serializer)
        if lifetime is not None:
            lifetime.add_key(key, store=self)
        return key

    def put_batch(self, objs, serializer=None, lifetime=None):
        return [self.put(o, serializer, lifetime) for o in objs]

    def get(self, key, deserializer=None, default=None):
        """The object at key (cached), or default when there is none."""
        self._check()
        with self._cache_lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        with self._timer("get"):
            obj = self._get_one(key, deserializer)
        if obj is _MISSING:
            return default
        if self.cache_size:
            with self._cache_lock:
                self._cache[key] = obj
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        return obj

    def exists(self, key):
        self._check()
        with self._timer("exists"):
            if self._wire is not None:
                return self._wire.exists(key)
            if self._native is not None:
                return self._native.exists(key)
            return self.connector.exists(key)

    def evict(self, key):
        """Removes the object (a no-op when it is not there)."""
        self._check()
        with self._cache_lock:
            self._cache.pop(key, None)
        with self._timer("evict"):
            if self._wire is not None:
                self._wire.evict(key)
            elif self._native is not None:
                self._native.evict(key)
            else:
                self.connector.evict(key)

    def is_cached(self, key):
        with self._cache_lock:
            return key in self._cache

    def proxy(self, obj, evict=False, lifetime=None, serializer=None, deserializer=None,
              populate_target=None):
        """Stores obj; returns a transparent Proxy of it (resolves in any process)."""
        key = self.put(obj, serializer, lifetime)
        p = self.proxy_from_key(key, evict=evict, deserializer=deserializer)
        if populate_target if populate_target is not None else self.populate_target:
            p.__factory__._populate(obj)
        return p

    def proxy_batch(self, objs, evict=False, lifetime=None, serializer=None,
                    deserializer=None):
        return [self.proxy(o, evict, lifetime, serializer, deserializer) for o in objs]

    def proxy_from_key(self, key, evict=False, deserializer=None):
        """A Proxy of the object already stored at key."""
        self._check()
        return Proxy(StoreFactory(key, self.config(), evict, deserializer, self))

    def locked_proxy(self, obj, **kwargs):
        """store.proxy(obj) inside a ProxyLocker."""
        return ProxyLocker(self.proxy(obj, **kwargs))

    def owned_proxy(self, obj, serializer=None, deserializer=None):
        """An OwnedProxy: the object is evicted when the proxy is deleted."""
        key = self.put(obj, serializer)
        return OwnedProxy(OwnedFactory(key, self.config(), False, deserializer, self))

    def future(self, serializer=None, deserializer=None, polling_interval=0.001):
        """A Future whose value is set later (possibly in another process).

        Over the native connectors the key is the engine's deferred key
        (NewKey): a Redis waiter wakes on the setter's signal, the others
        poll with backoff. A connector written in Python needs new_key and
        set (LocalConnector has them); polling_interval is its first wait."""
        self._check()
        if self._wire is not None:
            key = self._wire.new_key()
        elif self._native is not None:
            key = self._native.new_key()
        else:
            if not hasattr(self.connector, "new_key") or not hasattr(self.connector, "set"):
                raise NotImplementedError(
                    f"store.future() needs deferred keys: {type(self.connector).__name__} "
                    "has no new_key/set")
            key = self.connector.new_key()
        return Future(key, self.config(), serializer, deserializer, polling_interval)

    def close(self, clear=False):
        """Closes the connector and unregisters the store; later calls raise
        StoreClosedError."""
        if self._closed:
            return
        self._closed = True
        with self._cache_lock:
            self._cache.clear()
        with _registry_lock:
            cur = _registry.get(self.name)
            if cur is not None and cur[1] is self:
                del _registry[self.name]
        if self._native is not None:
            self._native.close()
        if self._wire is not None:
            self._wire.close()
        self.connector.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"Store({self.name!r}, {self.connector!r})"


# -- factories --------------------------------------------------------------

class StoreFactory(Factory):
    """Resolves a key through its store: the registered one of that name, or
    one built from the config. Pickles as (key, config, evict)."""

    __slots__ = ("key", "store_config", "evict", "deserializer", "_store", "_pid")

    def __init__(self, key, store_config, evict=False, deserializer=None, store=None):
        super().__init__()
        self.key = key
        self.store_config = store_config
        self.evict = evict
        self.deserializer = deserializer
        # The store that made the proxy (not pickled): used in this process.
        self._store = store
        self._pid = os.getpid()

    def _populate(self, obj):
        with self._lock:
            self._target, self._done = obj, True

    def get_store(self):
        s = self._store
        if s is not None and not s._closed and self._pid == os.getpid():
            return s
        return _store_for(self.store_config)

    def resolve(self):
        store = self.get_store()
        obj = store.get(self.key, self.deserializer, default=_MISSING)
        if obj is _MISSING:
            raise ProxyResolveMissingKeyError(
                f"key {self.key!r} is not in store {self.store_config['name']!r}")
        if self.evict:
            store.evict(self.key)
        return obj

    def __reduce__(self):
        return type(self), (self.key, self.store_config, self.evict, self.deserializer)


def get_key(proxy):
    """The key of a store proxy (None for other proxies). Never resolves."""
    f = proxy.__factory__ if is_proxy(proxy) else None
    return f.key if isinstance(f, StoreFactory) else None


# -- ownership --------------------------------------------------------------

class OwnedFactory(StoreFactory):
    __slots__ = ("refs", "mut", "valid", "__weakref__")

    def __init__(self, key, store_config, evict=False, deserializer=None, store=None):
        super().__init__(key, store_config, evict, deserializer, store)
        self.refs = 0
        self.mut = False
        self.valid = True


class OwnedProxy(Proxy):
    """Owns its object: deleting the proxy evicts it (after ProxyStore's
    ownership model and the C++ OwnedProxy). borrow / mut_borrow hand out
    references that never evict; clone copies the object under a new key."""

    __slots__ = ()

    def __del__(self):
        # A finalizer may run on a proxy whose __init__ failed (its factory is
        # proxy._NoFactory) and at interpreter exit, when module globals are
        # gone: it never raises.
        try:
            f = self.__factory__
            if isinstance(f, OwnedFactory) and f.valid:
                f.valid = False
                s = f.get_store()
                if not s._closed:
                    s.evict(f.key)
        except Exception:  # noqa: BLE001 - best effort in a finalizer
            pass


class RefProxy(Proxy):
    """A shared borrow of an OwnedProxy (shares its resolution)."""

    __slots__ = ()

    def __del__(self):
        try:  # never raises (OwnedProxy.__del__)
            f = self.__factory__
            if isinstance(f, OwnedFactory) and f.refs > 0:
                f.refs -= 1
        except Exception:  # noqa: BLE001 - best effort in a finalizer
            pass


class RefMutProxy(Proxy):
    """The one mutable borrow of an OwnedProxy; update() writes it back."""

    __slots__ = ()

    def __del__(self):
        try:  # never raises (OwnedProxy.__del__)
            f = self.__factory__
            if isinstance(f, OwnedFactory):
                f.mut = False
        except Exception:  # noqa: BLE001 - best effort in a finalizer
            pass


def _owned_factory(proxy):
    if type(proxy) is not OwnedProxy:
        raise ReferenceNotOwnedError(f"not an OwnedProxy: {type(proxy).__name__}")
    f = proxy.__factory__
    if not f.valid:
        raise ReferenceInvalidError("the OwnedProxy no longer owns its object")
    return f


def borrow(proxy):
    """A RefProxy of an OwnedProxy. MutableBorrowError while it is mutably borrowed."""
    f = _owned_factory(proxy)
    if f.mut:
        raise MutableBorrowError("the proxy is mutably borrowed")
    f.refs += 1
    return RefProxy(f)


def mut_borrow(proxy):
    """A RefMutProxy of an OwnedProxy. MutableBorrowError while any borrow exists."""
    f = _owned_factory(proxy)
    if f.mut or f.refs:
        raise MutableBorrowError("the proxy is borrowed already")
    f.mut = True
    return RefMutProxy(f)


def clone(proxy):
    """A new OwnedProxy of a copy of the object (stored under a new key)."""
    f = _owned_factory(proxy)
    store = f.get_store()
    return store.owned_proxy(proxy.__wrapped__, deserializer=f.deserializer)


def into_owned(proxy):
    """An OwnedProxy taking over a plain store proxy's object."""
    if type(proxy) is not Proxy or not isinstance(proxy.__factory__, StoreFactory):
        raise ValueError("into_owned takes a plain store Proxy")
    f = proxy.__factory__
    return OwnedProxy(OwnedFactory(f.key, f.store_config, False, f.deserializer, f._store))


def update(proxy):
    """Writes a mutably borrowed object's current value back under its key."""
    if type(proxy) is not RefMutProxy:
        raise ReferenceNotOwnedError("update() takes a RefMutProxy")
    f = proxy.__factory__
    store = f.get_store()
    store._check()
    with store._cache_lock:
        store._cache.pop(f.key, None)
    store._set_one(f.key, proxy.__wrapped__, None)


# -- lifetimes --------------------------------------------------------------

class Lifetime:
    """Evicts every key added to it when it ends (close())."""

    def __init__(self, store=None, name=None):
        self.store = store
        self.name = name or uuid.uuid4().hex[:8]
        self._keys = []
        self._lock = threading.Lock()
        self._done = False

    def add_key(self, *keys, store=None):
        s = store or self.store
        if s is None:
            raise ValueError("add_key needs a store")
        with self._lock:
            if self._done:
                raise RuntimeError(f"lifetime {self.name} has ended")
            self._keys.extend((s, k) for k in keys)

    def add_proxy(self, *proxies):
        for p in proxies:
            f = p.__factory__
            if not isinstance(f, StoreFactory):
                raise ValueError("add_proxy takes store proxies")
            self.add_key(f.key, store=f.get_store())

    def done(self):
        return self._done

    def close(self):
        with self._lock:
            if self._done:
                return
            self._done = True
            keys, self._keys = self._keys, []
        for s, k in keys:
            if not s._closed:
                s.evict(k)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class ContextLifetime(Lifetime):
    """Ends when its `with` block exits (or at close())."""


class LeaseLifetime(Lifetime):
    """Ends `expiry` seconds after creation unless extend() pushes it back."""

    def __init__(self, store=None, expiry=10.0, name=None):
        super().__init__(store, name)
        self._expires = time.monotonic() + expiry
        self._cv = threading.Condition()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"xsilo-lease-{self.name}")
        self._thread.start()

    def extend(self, amount):
        with self._cv:
            if self._done:
                raise RuntimeError(f"lifetime {self.name} has ended")
            self._expires = time.monotonic() + amount
            self._cv.notify()

    def _run(self):
        with self._cv:
            while not self._done:
                left = self._expires - time.monotonic()
                if left <= 0:
                    break
                self._cv.wait(left)
        self.close()

    def close(self):
        super().close()
        with self._cv:
            self._cv.notify()


class StaticLifetime(Lifetime):
    """One per process; ends at interpreter exit."""

    _instance = None

    def __new__(cls, *args, **kwargs):
        if cls._instance is None:
            inst = super().__new__(cls)
            Lifetime.__init__(inst, None, "static")
            atexit.register(inst.close)
            cls._instance = inst
        return cls._instance

    def __init__(self, *args, **kwargs):
        pass


# -- futures ----------------------------------------------------------------

class Future:
    """A value set later under a reserved key; picklable, so the setter and
    the waiters may be in different processes."""

    def __init__(self, key, store_config, serializer=None, deserializer=None,
                 polling_interval=0.001):
        self.key = key
        self.store_config = store_config
        self.serializer = serializer
        self.deserializer = deserializer
        self.polling_interval = polling_interval

    def _store(self):
        return _store_for(self.store_config)

    def done(self):
        return self._store().exists(self.key)

    def set_result(self, obj):
        """Sets the value (a second call overwrites it) and wakes the waiters."""
        s = self._store()
        s._check()
        with s._cache_lock:
            s._cache.pop(self.key, None)
        s._set_one(self.key, obj, self.serializer)

    def result(self, timeout=None):
        """The value; TimeoutError when it is not set within timeout seconds
        (None: wait for ever, in slices of a second so that signals such as
        KeyboardInterrupt are handled)."""
        s = self._store()
        if timeout is not None and timeout < 0:
            raise ValueError("timeout must be >= 0 or None")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            slice_ = 1.0 if deadline is None else min(1.0, max(0.0, deadline - time.monotonic()))
            if s._wait(self.key, slice_, self.polling_interval):
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"future {self.key!r} not set within {timeout}s")
        obj = s.get(self.key, self.deserializer, default=_MISSING)
        if obj is _MISSING:
            raise ProxyResolveMissingKeyError(
                f"future {self.key!r} was set but its object is gone from store {s.name!r}")
        return obj

    def proxy(self, timeout=None):
        """A Proxy that waits for the value when it resolves."""
        return Proxy(_FutureFactory(self, timeout))


class _FutureFactory(Factory):
    __slots__ = ("future", "timeout")

    def __init__(self, future, timeout):
        super().__init__()
        self.future = future
        self.timeout = timeout

    def resolve(self):
        return self.future.result(self.timeout)

    def __reduce__(self):
        return _FutureFactory, (self.future, self.timeout)


def is_store_proxy(obj):
    return is_proxy(obj) and isinstance(obj.__factory__, StoreFactory)


