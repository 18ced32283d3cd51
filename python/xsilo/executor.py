"""StoreExecutor: any concurrent.futures.Executor, with large arguments and
results travelling through a Store as proxies.

    with StoreExecutor(ProcessPoolExecutor(4), store,
                       should_proxy=ProxySize(1 << 20)) as ex:
        futures = [ex.submit(work, big_array) for big_array in inputs]
        results = [f.result() for f in futures]

Arguments (positional and keyword) that should_proxy accepts are put in the
store and replaced by proxies, so only a few hundred bytes cross to the
worker, which resolves them on first use. Each such input is evicted when
its task has finished (successfully or not). Results that should_proxy
accepts come back as proxies whose object is evicted when it is resolved.
The wrapped function pickles as the function plus the store's config, so
process pools (and Dask's or Parsl's executors) rebuild the store in the
worker once per process.
"""

import concurrent.futures
import sys

from .proxy import is_proxy
from .pstore import _store_for


def _size(obj):
    n = getattr(obj, "nbytes", None)  # numpy, memoryview, torch (>= 2)
    if isinstance(n, int):
        return n
    if isinstance(obj, (bytes, bytearray, str)):
        return len(obj)
    if type(obj).__module__.startswith("torch") and hasattr(obj, "element_size"):
        return obj.element_size() * obj.numel()
    return sys.getsizeof(obj)


class ProxyAlways:
    """Proxy every argument and result (except proxies and None)."""

    def __call__(self, obj):
        return True


class ProxyNever:
    def __call__(self, obj):
        return False


class ProxyType:
    """Proxy objects of these types."""

    def __init__(self, *types):
        self.types = types

    def __call__(self, obj):
        return isinstance(obj, self.types)


class ProxySize:
    """Proxy objects of at least min_bytes (nbytes, len, or sys.getsizeof)."""

    def __init__(self, min_bytes):
        self.min_bytes = int(min_bytes)

    def __call__(self, obj):
        return _size(obj) >= self.min_bytes


class _Task:
    """The function, run in the worker: results that should_proxy accepts are
    put in the store (evicted when resolved) and returned as proxies."""

    def __init__(self, fn, store_config, should_proxy, proxy_result):
        self.fn = fn
        self.store_config = store_config
        self.should_proxy = should_proxy
        self.proxy_result = proxy_result

    def __call__(self, *args, **kwargs):
        result = self.fn(*args, **kwargs)
        if (self.proxy_result and result is not None and not is_proxy(result)
                and self.should_proxy(result)):
            return _store_for(self.store_config).proxy(result, evict=True)
        return result


class StoreExecutor(concurrent.futures.Executor):
    """Wraps executor; see the module doc.

    should_proxy: a callable obj -> bool (ProxyAlways, ProxySize(n), ProxyType(...));
    default ProxySize(64 KiB). proxy_results: proxy results too.
    close_store: close the store at shutdown.
    """

    def __init__(self, executor, store, should_proxy=None, proxy_results=True,
                 close_store=False):
        self.executor = executor
        self.store = store
        self.should_proxy = should_proxy if should_proxy is not None else ProxySize(64 << 10)
        self.proxy_results = proxy_results
        self.close_store = close_store
        self._config = store.config()

    def _wrap(self, obj, keys):
        if obj is None or is_proxy(obj) or not self.should_proxy(obj):
            return obj
        p = self.store.proxy(obj)
        keys.append(p.__factory__.key)
        return p

    def submit(self, fn, /, *args, **kwargs):
        keys = []
        args = tuple(self._wrap(a, keys) for a in args)
        kwargs = {k: self._wrap(v, keys) for k, v in kwargs.items()}
        task = _Task(fn, self._config, self.should_proxy, self.proxy_results)
        try:
            future = self.executor.submit(task, *args, **kwargs)
        except BaseException:
            self._evict(keys)
            raise
        if keys:
            future.add_done_callback(lambda _f, keys=keys: self._evict(keys))
        return future

    def _evict(self, keys):
        if self.store._closed:
            return
        for k in keys:
            self.store.evict(k)

    def map(self, fn, *iterables, timeout=None, chunksize=1):
        futures = [self.submit(fn, *args) for args in zip(*iterables)]

        def results():
            try:
                for f in futures:
                    yield f.result(timeout)
            finally:
                for f in futures:
                    f.cancel()

        return results()

    def shutdown(self, wait=True, *, cancel_futures=False):
        self.executor.shutdown(wait=wait, cancel_futures=cancel_futures)
        if self.close_store:
            self.store.close()
