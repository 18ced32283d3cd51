"""Store and Proxy: the data plane, after ProxyStore.

    store = xsilo.Store("models", connector="file", options={"dir": "/tmp/m"})
    p = store.proxy(model.state_dict())     # uploaded once, p is a reference
    payload = pickle.dumps(p)               # a few hundred bytes
    # in another process, which never saw the store:
    sd = pickle.loads(payload).resolve()    # rebuilt from the reference

A proxy resolves lazily, once, thread-safely. Objects are bytes-like
values, tensor dicts (state_dicts; stored as one safetensors object),
single tensors, or xsilo.Message.
"""

import threading
from collections import OrderedDict

from . import _xsilo

# Kinds of object a proxy refers to, and how the Python value is rebuilt.
_BYTES, _TENSORS, _TENSOR, _MESSAGE = "bytes", "tensors", "tensor", "message"
_SINGLE = "tensor"  # the name a single tensor is stored under


def _is_tensor_like(obj):
    mod = type(obj).__module__
    return isinstance(obj, _xsilo.Tensor) or mod.startswith("torch") or mod.startswith("numpy")


def _flavor(values):
    """'torch' when the tensors came from torch, 'numpy' from numpy, else 'xsilo'."""
    for v in values:
        mod = type(v).__module__
        if mod.startswith("torch"):
            return "torch"
        if mod.startswith("numpy"):
            return "numpy"
    return "xsilo"


def _convert(t, flavor):
    if flavor == "torch":
        return t.torch()
    if flavor == "numpy":
        return t.numpy()
    return t


def _classify(obj):
    if isinstance(obj, _xsilo.Message):
        return _MESSAGE, "xsilo"
    if isinstance(obj, dict):
        return _TENSORS, _flavor(obj.values())
    if _is_tensor_like(obj):
        return _TENSOR, _flavor([obj])
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return _BYTES, "bytes"
    raise ValueError(
        f"cannot store a {type(obj).__name__}: expected bytes, a tensor, "
        "a dict of tensors (state_dict) or an xsilo.Message"
    )


def _prepare(obj):
    """(kind, flavor, the _Store method suffix, what that method takes) for obj."""
    kind, flavor = _classify(obj)
    if kind == _BYTES:
        return kind, flavor, "bytes", _as_byte_view(obj)
    if kind == _MESSAGE:
        return kind, flavor, "message", obj
    if kind == _TENSOR:
        return kind, flavor, "tensors", {_SINGLE: obj}
    return kind, flavor, "tensors", dict(obj)


def _as_byte_view(obj):
    mv = memoryview(obj)
    if not mv.c_contiguous:
        raise ValueError("bytes-like object is not contiguous")
    return mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv


def _rebuild(kind, flavor, value):
    if value is None:
        return None
    if kind == _BYTES:
        return memoryview(value)  # read-only, views the fetched bytes
    if kind == _MESSAGE:
        return value
    if kind == _TENSOR:
        return _convert(value[_SINGLE], flavor)
    return OrderedDict((k, _convert(v, flavor)) for k, v in value.items())


class Store:
    """A named store over one connector ("memory", "file", "redis", "s3", ...).

    options are the connector's settings (docs/store.md), e.g. {"dir": ...}
    for "file". cache_bytes bounds the cache of fetched objects. The store
    registers its name in this process so that proxies resolve through it.
    """

    def __init__(self, name, connector="memory", options=None, cache_bytes=256 << 20,
                 register=True, _impl=None):
        if _impl is not None:
            self._impl = _impl
            return
        opts = {str(k): str(v) for k, v in (options or {}).items()}
        self._impl = _xsilo._Store(name, connector, opts, int(cache_bytes), bool(register))

    @classmethod
    def from_config(cls, config_json):
        """The store a config (Store.config()) describes, created once per process."""
        return cls(None, _impl=_xsilo._Store.from_config(config_json))

    @property
    def name(self):
        return self._impl.name

    def config(self):
        """JSON that rebuilds an equivalent store in another process."""
        return self._impl.config()

    def put(self, obj):
        """Stores obj; returns its key (a JSON string)."""
        _, _, method, payload = _prepare(obj)
        return getattr(self._impl, "put_" + method)(payload)

    def get(self, key, kind=_TENSORS, flavor="torch"):
        """The object at key, or None. kind: 'bytes', 'tensors', 'tensor', 'message';
        flavor (tensors): 'torch', 'numpy' or 'xsilo'."""
        if kind == _BYTES:
            return _rebuild(kind, flavor, self._impl.get_bytes(key))
        if kind == _MESSAGE:
            return self._impl.get_message(key)
        if kind in (_TENSORS, _TENSOR):
            return _rebuild(kind, flavor, self._impl.get_tensors(key))
        raise ValueError(f"unknown kind {kind!r}")

    def exists(self, key):
        return self._impl.exists(key)

    def evict(self, key):
        self._impl.evict(key)

    def proxy(self, obj, evict_on_resolve=False):
        """Stores obj and returns a Proxy: a small picklable reference that
        resolves to an equal object, in this process or any other."""
        kind, flavor, method, payload = _prepare(obj)
        ref = getattr(self._impl, "proxy_" + method)(payload, evict_on_resolve)
        return Proxy(ref, kind, flavor)

    def metrics(self):
        return self._impl.metrics()

    def close(self):
        self._impl.close()


class Proxy:
    """A lazy reference to a stored object. resolve() fetches it once (many
    threads may call it; one fetches, the others wait); pickling carries
    only the reference (store config + key), never the object."""

    def __init__(self, reference, kind, flavor):
        self._reference = reference
        self._kind = kind
        self._flavor = flavor
        self._lock = threading.Lock()
        self._target = None
        self._resolved = False

    @property
    def reference(self):
        """The reference as JSON: the store's config, the key, the options."""
        return self._reference

    @property
    def resolved(self):
        return self._resolved

    def resolve(self):
        if self._resolved:
            return self._target
        with self._lock:
            if not self._resolved:
                if self._kind == _BYTES:
                    value = _xsilo._resolve_bytes(self._reference)
                elif self._kind == _MESSAGE:
                    value = _xsilo._resolve_message(self._reference)
                else:
                    value = _xsilo._resolve_tensors(self._reference)
                self._target = _rebuild(self._kind, self._flavor, value)
                self._resolved = True
        return self._target

    def __reduce__(self):
        return (Proxy, (self._reference, self._kind, self._flavor))

    # Container conveniences forward to the target.
    def __getitem__(self, key):
        return self.resolve()[key]

    def __len__(self):
        return len(self.resolve())

    def __iter__(self):
        return iter(self.resolve())

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.resolve(), name)

    def __repr__(self):
        state = "resolved" if self._resolved else "unresolved"
        return f"xsilo.Proxy({self._kind}, {state})"
