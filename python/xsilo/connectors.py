"""Connectors as Python objects, with ProxyStore's connector protocol.

A connector stores bytes under keys: put / get / exists / evict,
put_batch / get_batch, new_key / set (deferred keys), config /
from_config, close. Two kinds plug into xsilo.pstore.Store:

- native connectors run in the C++ engine (docs/store.md): FileConnector,
  RedisConnector, S3Connector, MultiConnector, MemoryConnector. The Store
  talks to the engine directly (gather writes, mmap reads, hiredis); the
  protocol methods here are for code that drives a connector itself.
  Their keys are the engine's JSON key strings.
- connectors written in Python: any object with the protocol methods
  (put(bytes) -> key, get(key) -> bytes | None, exists, evict, config,
  from_config, close; new_key and set for futures). LocalConnector, a
  process-local dict, is one.
"""

import json
import threading
import uuid

from . import _xsilo
from ._redis_wire import password_for


class Connector:
    """Base of the connector protocol. Batch forms default to loops."""

    def put(self, data):  # pragma: no cover - protocol
        raise NotImplementedError

    def get(self, key):  # pragma: no cover - protocol
        raise NotImplementedError

    def exists(self, key):  # pragma: no cover - protocol
        raise NotImplementedError

    def evict(self, key):  # pragma: no cover - protocol
        raise NotImplementedError

    def put_batch(self, datas):
        return [self.put(d) for d in datas]

    def get_batch(self, keys):
        return [self.get(k) for k in keys]

    def new_key(self, obj=None):
        raise NotImplementedError(f"{type(self).__name__} has no deferred keys")

    def set(self, key, data):
        raise NotImplementedError(f"{type(self).__name__} has no deferred keys")

    def config(self):  # pragma: no cover - protocol
        raise NotImplementedError

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class NativeConnector(Connector):
    """A connector of the C++ engine: type and options as in docs/store.md."""

    type = None

    def __init__(self, **options):
        self._options = {str(k): _opt(v) for k, v in options.items() if v is not None}
        self._impl = None
        self._lock = threading.Lock()

    @property
    def options(self):
        """The engine connector's options (docs/store.md)."""
        return dict(self._options)

    def _native(self):
        # A private engine store (no cache, not registered) for the protocol methods.
        with self._lock:
            if self._impl is None:
                self._impl = make_native_store(f"connector-{uuid.uuid4().hex}", self.type,
                                               self._options, 0)
            return self._impl

    def put(self, data):
        return self._native().put_bytes(memoryview(data))

    def get(self, key):
        t = self._native().get_bytes(key)
        return None if t is None else bytes(memoryview(t))

    def exists(self, key):
        return self._native().exists(key)

    def evict(self, key):
        self._native().evict(key)

    def new_key(self):
        """A deferred key, filled later with set (the engine's NewKey)."""
        return self._native().new_key()

    def set(self, key, data):
        """Writes data under a deferred key and wakes its waiters (redis)."""
        self._native().set_bytes(key, memoryview(data))

    def config(self):
        return dict(self._options)

    @classmethod
    def from_config(cls, config):
        c = cls.__new__(cls)
        NativeConnector.__init__(c, **config)
        return c

    def close(self):
        with self._lock:
            if self._impl is not None:
                self._impl.close()
                self._impl = None

    def __reduce__(self):
        return type(self).from_config, (self.config(),)

    def __repr__(self):
        return f"{type(self).__name__}({self._options})"


def _opt(v):
    if isinstance(v, bool):
        return "1" if v else "0"
    return str(v)


def make_native_store(name, connector_type, options, cache_bytes):
    """An engine store (xsilo._xsilo._Store), not registered in the C++ registry."""
    return _xsilo._Store(name, connector_type, dict(options), int(cache_bytes), False)


class FileConnector(NativeConnector):
    """Objects as files in a shared directory (write-then-rename, mmap reads).

    store_dir: the directory (created when missing). fsync: flush each
    object to disk before its key is returned. clear: accepted for
    ProxyStore compatibility; the directory is left in place at close.
    """

    type = "file"

    def __init__(self, store_dir, clear=False, fsync=False):
        super().__init__(dir=store_dir, fsync=fsync)

    @classmethod
    def from_config(cls, config):
        return cls(config["dir"], fsync=config.get("fsync") == "1")


class RedisConnector(NativeConnector):
    """Objects in a Redis server, in the engine's layout (split into parts
    below Redis's 512 MB limit; keys interchangeable with the engine's).

    wire: the Store reads and writes through xsilo._redis_wire (one
    pipelined round trip per put and get, payloads from and into the
    objects' memory) instead of the engine's hiredis path; both speak the
    same layout. The protocol methods here use the engine.
    """

    type = "redis"

    def __init__(self, hostname="127.0.0.1", port=6379, clear=False, prefix=None, password=None,
                 wire=True, **options):
        super().__init__(host=hostname, port=port, prefix=prefix, password=password, **options)
        self.wire = wire
        password_for(self._options)  # remembered here: a config carries no password

    def config(self):
        c = dict(self._options)
        c.pop("password", None)  # a reference carries no secret (password_file, REDISCLI_AUTH)
        if not self.wire:
            c["wire"] = "0"
        return c

    @classmethod
    def from_config(cls, config):
        c = dict(config)
        wire = c.pop("wire", "1") != "0"
        return cls(c.pop("host", "127.0.0.1"), int(c.pop("port", 6379)), wire=wire, **c)


class S3Connector(NativeConnector):
    """Objects in an S3 bucket (AWS, MinIO, Ceph, or `xsilo s3d`)."""

    type = "s3"

    def __init__(self, bucket, endpoint=None, region=None, access_key=None, secret_key=None,
                 prefix=None, **options):
        super().__init__(bucket=bucket, endpoint=endpoint, region=region, access_key=access_key,
                         secret_key=secret_key, prefix=prefix, **options)

    @classmethod
    def from_config(cls, config):
        c = dict(config)
        return cls(c.pop("bucket"), **c)


class MemoryConnector(NativeConnector):
    """The engine's process-local memory connector (segments shared by name)."""

    type = "memory"

    def __init__(self, name="default"):
        super().__init__(name=name)

    @classmethod
    def from_config(cls, config):
        return cls(config.get("name", "default"))


class ZeroMQConnector(NativeConnector):
    """Objects stay in the process that put them; its object server hands
    them out over ZeroMQ (the engine's zmq connector, docs/store.md). A key
    carries the server's tcp://host:port, so another process resolves it
    from the key alone: its own connector acts as a client (and serves its
    own puts from a server on a free port). The objects live as long as the
    connector that holds them: close it when nobody needs them any more.

    address: the host the server binds and puts in keys (127.0.0.1).
    port: 0 picks a free one. timeout: seconds to wait for each reply.
    """

    type = "zmq"

    def __init__(self, address="127.0.0.1", port=0, timeout=30.0, **options):
        super().__init__(host=address, port=port, timeout_ms=int(timeout * 1000), **options)


class UCXConnector(NativeConnector):
    """The same model as ZeroMQConnector over UCX (the engine's ucx connector,
    docs/store.md): TCP by default, RDMA transports with tls="...". Present
    when xsilo was built with libucx-dev."""

    type = "ucx"

    def __init__(self, address="127.0.0.1", port=0, timeout=30.0, **options):
        super().__init__(host=address, port=port, timeout_ms=int(timeout * 1000), **options)


class EndpointConnector(NativeConnector):
    """A client of this site's object endpoint (`xsilo endpoint start`,
    docs/endpoint.md). Objects stay at the endpoint of the site that put
    them; a key names that endpoint, and a get from another site reaches it
    through the local endpoint, directly or through the relay.

    address: the local endpoint's API, "127.0.0.1:PORT". timeout: seconds
    per call. put_to: the uuid of another endpoint that should own what this
    connector puts (reached through the local one).
    """

    type = "endpoint"

    def __init__(self, address, timeout=60.0, put_to=None, **options):
        super().__init__(address=address, timeout_ms=int(timeout * 1000), put_to=put_to,
                         **options)


class Policy:
    """Which objects a MultiConnector member takes (docs/store.md)."""

    def __init__(self, min_size_bytes=0, max_size_bytes=2**64 - 1, subset_tags=(),
                 superset_tags=(), host_pattern="", priority=0):
        self.min_size = int(min_size_bytes)
        self.max_size = int(max_size_bytes)
        self.subset_tags = list(subset_tags)
        self.superset_tags = list(superset_tags)
        self.host_pattern = host_pattern or ""
        self.priority = int(priority)

    def as_dict(self):
        return {"min_size": self.min_size, "max_size": self.max_size,
                "subset_tags": self.subset_tags, "superset_tags": self.superset_tags,
                "host_pattern": self.host_pattern, "priority": self.priority}


class MultiConnector(NativeConnector):
    """Routes objects over native member connectors by size, tags and host.

    connectors: {name: (connector, Policy)}; members must be native.
    """

    type = "multi"

    def __init__(self, connectors):
        members = []
        for name, (conn, policy) in connectors.items():
            if not isinstance(conn, NativeConnector):
                raise TypeError(f"MultiConnector member {name!r} must be a native connector, "
                                f"not {type(conn).__name__}")
            entry = {"name": name, "connector": {"type": conn.type, "options": conn.config()}}
            entry.update((policy or Policy()).as_dict())
            members.append(entry)
        super().__init__(connectors=json.dumps(members))

    @classmethod
    def from_config(cls, config):
        c = cls.__new__(cls)
        NativeConnector.__init__(c, **config)
        return c


_local_segments = {}
_local_lock = threading.Lock()


class LocalConnector(Connector):
    """A process-local dict, written in Python (ProxyStore's LocalConnector).

    Connectors built from the same config in one process share the dict;
    another process gets an empty one. Has deferred keys (new_key / set),
    so store.future() works over it.
    """

    def __init__(self, segment=None):
        self.segment = segment or uuid.uuid4().hex
        with _local_lock:
            self._data = _local_segments.setdefault(self.segment, {})
        self._lock = threading.Lock()

    def put(self, data):
        key = "local:" + uuid.uuid4().hex
        with self._lock:
            self._data[key] = bytes(data)
        return key

    def get(self, key):
        return self._data.get(key)

    def exists(self, key):
        return key in self._data

    def evict(self, key):
        self._data.pop(key, None)

    def new_key(self, obj=None):
        return "local:" + uuid.uuid4().hex

    def set(self, key, data):
        with self._lock:
            self._data[key] = bytes(data)

    def config(self):
        return {"segment": self.segment}

    def __len__(self):
        return len(self._data)

    def __reduce__(self):
        return LocalConnector, (self.segment,)
