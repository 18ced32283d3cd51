"""ProxyStore's peer connectors in Python (xsilo.proxystore): ZeroMQConnector
and UCXConnector keep objects in the process that put them, EndpointConnector
at the site's `xsilo endpoint`. A proxy pickled here resolves in a process
that never saw the connector, pulling the bytes from where they stayed."""

import os
import pickle
import json
import subprocess
import sys
import time
import urllib.request

import numpy
import pytest

import xsilo
import xsilo.proxystore as ps
from ps_util import free_port

HERE = os.path.dirname(os.path.abspath(__file__))


def xsilo_binary():
    # PYTHONPATH holds <build>/python (tests/python/CMakeLists.txt).
    for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        candidate = os.path.join(os.path.dirname(entry.rstrip("/")), "tools", "xsilo", "xsilo")
        if entry and os.access(candidate, os.X_OK):
            return candidate
    raise RuntimeError("no xsilo binary next to the xsilo module (build the xsilo target)")


def resolve_in_child(proxy, tmp_path):
    """Pickles the proxy to a file and resolves it in a fresh interpreter."""
    blob = pickle.dumps(proxy)
    assert len(blob) < 1024
    path = tmp_path / "proxy.pkl"
    path.write_bytes(blob)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [HERE, env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, os.path.join(HERE, "ps_util.py"), str(path)], env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("make", [ps.ZeroMQConnector, ps.UCXConnector], ids=["zmq", "ucx"])
def test_objects_stay_with_their_producer_and_resolve_elsewhere(make, tmp_path):
    connector = make()
    store = ps.Store(f"peer-{connector.type}-{tmp_path.name}", connector, register=True)
    try:
        p = store.proxy({"a": numpy.ones(1 << 20), "name": "ones"})  # 8 MB
        key = ps.get_key(p)
        assert store.exists(key)
        out = resolve_in_child(p, tmp_path)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == [str(float(1 << 20)), "ones", "2"]
        # Evicted at the producer, the object is gone for every holder.
        store.evict(key)
        assert not store.exists(key)
        out = resolve_in_child(p, tmp_path)
        assert out.returncode != 0
        assert "is not in store" in out.stderr, out.stderr
    finally:
        store.close()


def test_a_closed_producer_is_unavailable_not_a_hang(tmp_path):
    producer = ps.ZeroMQConnector(timeout=2)
    key = producer.put(b"x" * 1000)
    config = producer.config()
    producer.close()
    reader = ps.ZeroMQConnector.from_config(config)
    try:
        start = time.monotonic()
        with pytest.raises(Exception) as err:
            reader.get(key)
        assert "navailable" in str(err.value)
        assert time.monotonic() - start < 60
    finally:
        reader.close()


class Endpoint:
    """`xsilo endpoint start` on a free loopback port; stop() ends it."""

    def __init__(self, binary, workdir, relay=None, relay_ca=None, peer=True):
        port_file = os.path.join(workdir, "port")
        argv = [binary, "endpoint", "start", "--listen", "127.0.0.1:0", "--port-file", port_file,
                "--dir", os.path.join(workdir, "data")]
        if peer:
            argv += ["--peer-listen", "127.0.0.1:0"]
        if relay:
            # On one machine a hole-punched path always works: these are the
            # relay's cases (the punched path is tested in C++).
            argv += ["--relay", relay, "--relay-ca", relay_ca, "--no-punch"]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        line = self.proc.stdout.readline()  # printed once it serves
        assert line.startswith("endpoint "), line
        deadline = time.monotonic() + 60
        while not os.path.exists(port_file):  # written just after that line
            assert time.monotonic() < deadline, "no port file"
            time.sleep(0.01)
        with open(port_file) as f:
            self.address = f"127.0.0.1:{int(f.read())}"
        if relay:  # registration runs in the background: wait for it
            deadline = time.monotonic() + 60
            while not self.status().get("registered"):
                assert time.monotonic() < deadline, "the endpoint did not register"
                time.sleep(0.05)

    def status(self):
        with urllib.request.urlopen(f"http://{self.address}/status", timeout=10) as r:
            return json.loads(r.read())

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


def test_endpoint_connector_across_sites_through_the_relay(tmp_path):
    binary = xsilo_binary()
    relay_dir = tmp_path / "relay"
    relay_port = free_port()
    relay = subprocess.Popen([binary, "relay", "--listen", f"127.0.0.1:{relay_port}",
                              "--tls-self-signed", str(relay_dir), "--open"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    endpoints = []
    try:
        relay.stdout.readline()  # printed once it listens
        ca = str(relay_dir / "cert.pem")
        # Neither listens for peers (b cannot be dialled, nor can it dial a
        # back): the relay's pipe is the only path.
        for name in ("a", "b"):
            work = tmp_path / name
            work.mkdir()
            endpoints.append(Endpoint(binary, str(work), f"127.0.0.1:{relay_port}", ca, False))
        a, b = endpoints
        # Site B produces; a process of site A that knows only its own
        # endpoint resolves the proxy (config rebuilt with A's address).
        store = ps.Store(f"peer-endpoint-{tmp_path.name}", ps.EndpointConnector(b.address),
                         register=False)
        p = store.proxy({"a": numpy.ones(1 << 20), "name": "ones"})
        key = ps.get_key(p)
        reader = ps.EndpointConnector(a.address)
        data = reader.get(key)
        assert data == store.connector.get(key)
        assert len(data) > 8 << 20
        assert reader.exists(key)
        # A served its caller's get through the relay.
        served = a.status()["served"]
        assert served["relayed"] >= 1 and served["direct"] == 0, served
        # A peer changes only what it wrote: the owner refuses A's evict.
        with pytest.raises(xsilo.PermissionDeniedError):
            reader.evict(key)
        assert store.connector.exists(key)
        store.connector.evict(key)  # the owner's site may
        assert not reader.exists(key)
        reader.close()
        store.close()
    finally:
        for e in endpoints:
            e.stop()
        relay.terminate()
        relay.wait(timeout=30)
