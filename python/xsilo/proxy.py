"""Transparent lazy proxies: a Proxy behaves as its target object.

    p = Proxy(factory)        # factory() returns the target; nothing runs yet
    len(p), p.attr, p + 1, isinstance(p, dict), hash(p), iter(p), with p: ...
                              # each resolves p once (first use), then forwards

The proxy type is lazy-object-proxy's C extension (Debian's
python3-lazy-object-proxy), subclassed: it forwards every attribute and
every operator slot to the target and reports the target's class as its
own (`isinstance`). On top of it, xsilo adds:

- resolve once across threads: the factory is wrapped in a Factory that
  runs the real factory under a lock and keeps its outcome, so threads
  racing on an unresolved proxy (the fetch releases the GIL) get one fetch;
- pickling as the factory, never the target (a store factory is a key and
  a store config: a few hundred bytes);
- torch functions (torch.sum(p), torch.cat([p, q])) through
  __torch_function__, which unwraps proxies among the arguments;
- json.dumps of a proxied dict or list: json's C encoder checks exact types,
  so JSONEncoder.default is extended to unwrap xsilo proxies (only those;
  everything else goes to the original default).

Helpers: extract, is_resolved, resolve, resolve_async, is_proxy and
ProxyLocker. See docs/python.md.
"""

import concurrent.futures
import json
import threading

from lazy_object_proxy.cext import Proxy as _LazyProxy

try:  # the same type with a direct attribute read once resolved (fastproxy.cpp)
    from xsilo._fastproxy import FastProxy as _ProxyBase
except ImportError:  # pragma: no cover - built without it
    _ProxyBase = _LazyProxy


class ProxyResolveError(RuntimeError):
    """A proxy's factory failed; the cause is chained."""


class ProxyLockedError(RuntimeError):
    """A locked proxy (ProxyLocker) was used before unlock()."""


class Factory:
    """A callable returning the target, run once however many threads call it.

    Subclasses implement resolve(); a failure is raised to the caller and
    the next call tries again.
    """

    __slots__ = ("_lock", "_target", "_done")

    def __init__(self):
        self._lock = threading.Lock()
        self._target = None
        self._done = False

    def resolve(self):  # pragma: no cover - abstract
        raise NotImplementedError

    def __call__(self):
        if self._done:
            return self._target
        with self._lock:
            if not self._done:
                self._target = self.resolve()
                self._done = True
        return self._target

    def __getstate__(self):
        return None

    def __setstate__(self, state):
        Factory.__init__(self)


class SimpleFactory(Factory):
    """A Factory over any callable (its pickle is the callable's)."""

    __slots__ = ("fn",)

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def resolve(self):
        return self.fn()

    def __reduce__(self):
        return SimpleFactory, (self.fn,)


class _NoFactory(Factory):
    """The factory of a proxy whose construction never gave it one.

    lazy-object-proxy's C type reads its factory slot without a NULL check,
    so a proxy whose __init__ failed, or that was made by __new__ alone,
    would crash the interpreter when its __del__ or anything else touched
    __factory__. Proxy.__new__ installs this first: such a proxy raises a
    clear error when used and is inert in __del__."""

    __slots__ = ()

    def resolve(self):
        raise ProxyResolveError("this proxy has no factory: its construction failed or never ran")

    def __reduce__(self):
        raise TypeError("a proxy without a factory cannot be pickled")


_NO_FACTORY = _NoFactory()


class Proxy(_ProxyBase):
    """A lazy, transparent reference: resolves its factory on first use."""

    __slots__ = ()

    def __new__(cls, *args, **kwargs):
        self = super().__new__(cls)
        _LazyProxy.__init__(self, _NO_FACTORY)  # replaced by __init__
        return self

    def __init__(self, factory):
        if not isinstance(factory, Factory):
            factory = SimpleFactory(factory)
        super().__init__(factory)

    def __reduce__(self):
        return _rebuild_proxy, (type(self), self.__factory__)

    def __reduce_ex__(self, protocol):
        return self.__reduce__()

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return func(*_unwrap(args), **_unwrap(kwargs or {}))


def _rebuild_proxy(cls, factory):
    p = cls.__new__(cls)
    _LazyProxy.__init__(p, factory)
    return p


def _unwrap(x):
    t = type(x)
    if issubclass(t, _LazyProxy):
        return x.__wrapped__
    if t is tuple or t is list:
        return t(_unwrap(v) for v in x)
    if t is dict:
        return {k: _unwrap(v) for k, v in x.items()}
    return x


def is_proxy(obj):
    """True for a proxy (without resolving it; isinstance would see the target)."""
    return issubclass(type(obj), _LazyProxy)


def _check(proxy):
    if not is_proxy(proxy):
        raise TypeError(f"not a proxy: {type(proxy).__name__}")


def extract(proxy):
    """The target object itself (resolving the proxy if needed)."""
    _check(proxy)
    return proxy.__wrapped__


def is_resolved(proxy):
    """True once the proxy has its target (never resolves)."""
    _check(proxy)
    return proxy.__resolved__


def resolve(proxy):
    """Resolves the proxy now (a no-op when it is already resolved)."""
    _check(proxy)
    proxy.__wrapped__  # noqa: B018 - evaluation resolves


_pool = None
_pool_lock = threading.Lock()


def resolve_async(proxy):
    """Starts resolving in the background; returns a concurrent.futures.Future
    that completes (None, or the resolve error) when the target is there."""
    _check(proxy)
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="xsilo-resolve")
    if proxy.__resolved__:
        f = concurrent.futures.Future()
        f.set_result(None)
        return f
    return _pool.submit(resolve, proxy)


class ProxyLocker:
    """Keeps a proxy from resolving where it must not (e.g. inside code that
    would touch it by accident). Any use raises ProxyLockedError; unlock()
    hands the proxy back. Pickles as the locked proxy's small reference."""

    __slots__ = ("_proxy",)

    def __init__(self, proxy):
        _check(proxy)
        object.__setattr__(self, "_proxy", proxy)

    def unlock(self):
        return object.__getattribute__(self, "_proxy")

    def __getattr__(self, name):
        raise ProxyLockedError(f"proxy is locked: unlock() it before using .{name}")

    def __setattr__(self, name, value):
        raise ProxyLockedError("proxy is locked: unlock() it first")

    def __reduce__(self):
        return ProxyLocker, (self.unlock(),)

    def __repr__(self):
        return "xsilo.ProxyLocker(<locked proxy>)"


_json_default = json.JSONEncoder.default


def _default(self, o):
    if issubclass(type(o), _LazyProxy):
        return o.__wrapped__
    return _json_default(self, o)


if json.JSONEncoder.default is not _default and getattr(
        json.JSONEncoder.default, "__module__", "") != __name__:
    json.JSONEncoder.default = _default
