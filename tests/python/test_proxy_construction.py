"""Every proxy type survives a failed __init__, a missing factory and its
__del__ at interpreter exit (#62 item 1).

lazy-object-proxy's C type reads its factory slot without a NULL check, so
before xsilo.proxy._NoFactory a proxy whose __init__ raised crashed the
interpreter in its __del__. Each case runs in a child interpreter: a crash
is a failed test here, not the end of the pytest run.
"""

import os
import subprocess
import sys
import textwrap

import pytest

# The proxy types of both import paths, by name in the child.
PROXY_TYPES = [
    "xsilo.proxy.Proxy",
    "xsilo.pstore.OwnedProxy",
    "xsilo.pstore.RefProxy",
    "xsilo.pstore.RefMutProxy",
]

# Argument lists no proxy type accepts: (args, kwargs) as source text.
WRONG_ARGUMENTS = [
    "(), {}",
    "(lambda: 1, 2, 3), {}",
    "(lambda: 1,), {'target': 1}",
    "(lambda: 1,), {'cache_defaults': True, 'target': 1}",
    "(), {'factory': lambda: 1, 'bogus': 1}",
]


def run_child(source):
    env = dict(os.environ)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(source)], env=env,
                          capture_output=True, text=True, timeout=120)


def check(result):
    assert result.returncode == 0, (
        f"child exited {result.returncode} (negative: killed by signal)\n"
        f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}")
    # A finalizer that raised prints "Exception ignored in ..." and goes on.
    assert "Exception ignored" not in result.stderr, result.stderr
    return result.stdout


@pytest.mark.parametrize("type_name", PROXY_TYPES)
def test_each_wrong_argument_list_raises_and_the_half_built_proxy_is_collected(type_name):
    module, name = type_name.rsplit(".", 1)
    out = check(run_child(f"""
        import gc, importlib
        cls = getattr(importlib.import_module({module!r}), {name!r})
        refused = 0
        for args, kwargs in [{", ".join("(" + a + ")" for a in WRONG_ARGUMENTS)}]:
            try:
                cls(*args, **kwargs)
            except TypeError:
                refused += 1
            gc.collect()
        print("refused", refused)
    """))
    # Each list is refused with TypeError (and each half-built proxy was
    # collected, or the child would have crashed).
    assert "refused 5" in out, out


@pytest.mark.parametrize("type_name", PROXY_TYPES)
def test_a_proxy_made_by_new_alone_raises_a_clear_error_when_used(type_name):
    module, name = type_name.rsplit(".", 1)
    out = check(run_child(f"""
        import gc, importlib, pickle
        from xsilo.proxy import ProxyResolveError
        cls = getattr(importlib.import_module({module!r}), {name!r})
        p = cls.__new__(cls)
        try:
            p + 1
        except ProxyResolveError as e:
            print("use:", e)
        try:
            pickle.dumps(p)
        except TypeError as e:
            print("pickle:", e)
        del p
        gc.collect()
        print("collected")
    """))
    assert "use: this proxy has no factory" in out
    assert "pickle: a proxy without a factory cannot be pickled" in out
    assert "collected" in out


def test_half_built_and_live_proxies_in_globals_survive_interpreter_exit(tmp_path):
    # Module globals are torn down in no particular order at exit, so the
    # finalizers run while the names they use may already be gone.
    check(run_child(f"""
        import xsilo.pstore as ps
        from xsilo.connectors import FileConnector
        from xsilo.proxy import Proxy
        store = ps.Store("exit-store", FileConnector({str(tmp_path)!r}))
        owned = store.owned_proxy([1, 2, 3])
        borrowed = ps.borrow(owned)
        plain = store.proxy({{"a": 1}})
        halves = []
        for cls in (Proxy, ps.OwnedProxy, ps.RefProxy, ps.RefMutProxy):
            halves.append(cls.__new__(cls))
            try:
                cls()
            except TypeError:
                pass
        cycle = [Proxy(lambda: 1)]
        cycle.append(cycle)
        print("exiting")
    """))


def test_a_factory_that_is_none_fails_on_use_not_in_the_finalizer():
    out = check(run_child("""
        import gc
        from xsilo.proxy import Proxy, ProxyResolveError
        import xsilo.pstore as ps
        for cls in (Proxy, ps.OwnedProxy, ps.RefProxy, ps.RefMutProxy):
            p = cls(None)
            try:
                p.anything
            except (ProxyResolveError, TypeError) as e:
                print(cls.__name__, "refused", type(e).__name__)
            del p
            gc.collect()
    """))
    assert out.count("refused") == 4, out
