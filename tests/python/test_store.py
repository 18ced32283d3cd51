"""Store and Proxy from Python, resolved here and in another process."""

import pickle
import threading
import zlib

import numpy as np
import pytest
import torch

import xsilo


@pytest.fixture
def file_store(tmp_path, request):
    s = xsilo.Store(f"py-{request.node.name}", connector="file", options={"dir": str(tmp_path)})
    yield s
    s.close()


def test_put_get_each_kind(file_store):
    sd = {"w": torch.randn(3, 4), "b": torch.arange(4, dtype=torch.int32)}
    key = file_store.put(sd)
    got = file_store.get(key)
    assert set(got) == {"w", "b"} and all(torch.equal(got[k], sd[k]) for k in sd)

    key = file_store.put(b"hello bytes")
    assert bytes(file_store.get(key, kind="bytes")) == b"hello bytes"

    t = torch.randn(5).to(torch.bfloat16)
    key = file_store.put(t)
    assert torch.equal(file_store.get(key, kind="tensor"), t)

    a = np.arange(6, dtype=np.float64)
    key = file_store.put({"a": a})
    assert np.array_equal(file_store.get(key, flavor="numpy")["a"], a)

    m = xsilo.Message(type="m", round=2, params={"k": "v"}, tensors={"x": torch.ones(3)})
    key = file_store.put(m)
    back = file_store.get(key, kind="message")
    assert back.type == "m" and back.round == 2 and back.params == {"k": "v"}

    assert file_store.exists(key)
    file_store.evict(key)
    assert not file_store.exists(key)
    assert file_store.get(key, kind="message") is None


def test_proxy_resolves_once_lazily_and_thread_safely(file_store):
    sd = {"w": torch.randn(100, 100)}
    p = file_store.proxy(sd)
    assert not p.resolved
    results = []
    threads = [threading.Thread(target=lambda: results.append(p.resolve())) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert p.resolved
    assert all(r is results[0] for r in results)  # one resolution, shared
    assert torch.equal(results[0]["w"], sd["w"])
    assert file_store.metrics()["get"]["count"] == 1
    assert torch.equal(p["w"], sd["w"])  # container access forwards
    assert len(p) == 1


def test_pickled_proxy_carries_a_reference_not_the_object(file_store):
    big = {"w": torch.randn(1 << 18)}  # 1 MiB
    p = file_store.proxy(big)
    data = pickle.dumps(p)
    assert len(data) < 4096
    q = pickle.loads(data)
    assert not q.resolved
    assert torch.equal(q.resolve()["w"], big["w"])


def test_proxy_resolves_in_another_process_from_its_reference(peers, tmp_path):
    store = xsilo.Store("py-cross-process", connector="file", options={"dir": str(tmp_path)})
    try:
        sd = {"w": torch.randn(256, 256), "m": torch.tensor([True, False, True])}
        raw = bytes(range(256)) * 1000
        for obj in (sd, raw):
            p = store.proxy(obj)
            out = peers.report(peers.start("resolve", proxy=pickle.dumps(p).hex()))
            if obj is raw:
                assert out == {"bytes": zlib.crc32(raw), "len": len(raw)}
            else:
                assert out["w"][0] == "torch.float32" and out["w"][1] == [256, 256]
                assert out["m"][0] == "torch.bool"
                assert out["w"][2] == zlib.crc32(sd["w"].numpy().tobytes())
    finally:
        store.close()


def test_evict_on_resolve(file_store):
    p = file_store.proxy({"w": torch.ones(3)}, evict_on_resolve=True)
    key_json = p.reference
    assert torch.equal(p.resolve()["w"], torch.ones(3))
    q = pickle.loads(pickle.dumps(xsilo.Proxy(key_json, "tensors", "torch")))
    with pytest.raises(xsilo.NotFoundError):
        q.resolve()


def test_store_errors(tmp_path):
    with pytest.raises(ValueError, match="connector"):
        xsilo.Store("bad", connector="no-such-connector")
    s = xsilo.Store("dup", connector="memory")
    try:
        with pytest.raises(xsilo.AlreadyExistsError):
            xsilo.Store("dup", connector="memory")
    finally:
        s.close()
    s = xsilo.Store("kinds", connector="memory")
    try:
        with pytest.raises(ValueError, match="cannot store"):
            s.put(object())
        with pytest.raises(ValueError, match="not an xsilo key"):
            s.get("{not json")
    finally:
        s.close()
