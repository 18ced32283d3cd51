"""StoreExecutor over thread and process pools: large arguments and results
travel as proxies, and every input is evicted when its task has finished."""

import json
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import numpy
import pytest

import xsilo.proxystore as ps
from ps_util import array_sum, concat, double


@pytest.fixture
def store(tmp_path):
    s = ps.Store(f"exec-{tmp_path.name}", ps.FileConnector(str(tmp_path / "objects")),
                 register=True)
    yield s
    s.close()


def objects(store):
    return sorted(os.listdir(store.connector.config()["dir"]))


def pools():
    # forkserver: workers are not forks of this (threaded) test process
    ctx = multiprocessing.get_context("forkserver")
    return [("threads", lambda: ThreadPoolExecutor(4)),
            ("processes", lambda: ProcessPoolExecutor(2, mp_context=ctx))]


@pytest.mark.parametrize("name,make", pools(), ids=[n for n, _ in pools()])
def test_inputs_are_evicted_when_tasks_finish(store, name, make):
    inputs = [numpy.full(1 << 17, i, dtype=numpy.float64) for i in range(8)]  # 1 MB each
    with ps.StoreExecutor(make(), store, should_proxy=ps.ProxySize(1 << 16)) as ex:
        futures = [ex.submit(array_sum, x) for x in inputs]
        sums = [f.result(timeout=300) for f in futures]
        assert sums == [float(i * (1 << 17)) for i in range(8)]
    assert objects(store) == []  # every input evicted, results were small


@pytest.mark.parametrize("name,make", pools(), ids=[n for n, _ in pools()])
def test_large_results_come_back_as_proxies_and_go_when_resolved(store, name, make):
    a, b = numpy.ones(1 << 16), numpy.zeros(1 << 16)
    with ps.StoreExecutor(make(), store, should_proxy=ps.ProxySize(1 << 16)) as ex:
        r = ex.submit(concat, a, b=b).result(timeout=300)
        assert ps.is_proxy(r) and not ps.is_resolved(r)
        assert r.shape == (1 << 17,) and numpy.sum(r) == 1 << 16
        assert list(ex.map(double, [1, 2, 3])) == [2, 4, 6]  # small: passed as is
    assert objects(store) == []


def test_a_failing_task_still_evicts_its_inputs(store):
    with ps.StoreExecutor(ThreadPoolExecutor(2), store, should_proxy=ps.ProxyAlways()) as ex:
        f = ex.submit(lambda x: 1 / 0, b"x" * 1000)
        with pytest.raises(ZeroDivisionError):
            f.result(timeout=300)
    assert objects(store) == []


def test_policies():
    assert ps.ProxySize(10)(b"x" * 10) and not ps.ProxySize(11)(b"x" * 10)
    assert ps.ProxySize(800)(numpy.zeros(100)) and ps.ProxyType(dict)({})
    assert not ps.ProxyNever()(b"x" * 10**6) and ps.ProxyAlways()(1)


def test_forked_workers_draw_their_own_object_ids(store):
    # The engine's id generator is per thread; a forked child reseeds it, so
    # children forked from one thread never put under the same key (before
    # the reseed, both children here drew the parent's next id).
    store.put(numpy.ones(4))  # the parent's generator is seeded and used
    keys = []
    for _ in range(2):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: one put, its key to the parent, no cleanup
            os.close(r)
            try:
                os.write(w, store.put(numpy.zeros(4)).encode())
            finally:
                os._exit(0)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            keys.append(f.read().decode())
        assert os.waitpid(pid, 0)[1] == 0
    keys.append(store.put(numpy.ones(4)))
    assert len({json.loads(k)["id"] for k in keys}) == 3, keys
