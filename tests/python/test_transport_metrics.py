"""Transport metrics from Python: the C++ MeteredTransport and /metrics endpoint
behind xsilo.Transport(..., metrics=, metrics_port=, metrics_address=).

Every count is checked exactly. No test waits for anything to happen: a
blocking send returns after the decorator counted it, and a message is
counted before receive() can return it.
"""

import gc
import re
import socket
import threading
import urllib.error
import urllib.request

import pytest
import torch

import xsilo
import xsilo.fl
from conftest import free_port

SERIES = re.compile(r'^([a-z_]+)\{(.*)\} (\S+)$')


def scrape(url):
    with urllib.request.urlopen(url, timeout=30) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return r.read().decode()


def samples(text):
    """{(name, ((label, value), ...)): value} of every sample line."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SERIES.match(line)
        assert m, f"not a labelled sample: {line!r}"
        labels = tuple(sorted(re.findall(r'([a-z_]+)="([^"]*)"', m.group(2))))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def value(s, name, party, peer, route="grpc"):
    return s.get((name, (("party", party), ("peer", str(peer)), ("route", route))))


def message(*sizes, round=0):
    """A message of float32 tensors holding sizes[i] elements each."""
    return xsilo.Message(type="m", round=round,
                         tensors={f"t{i}": torch.full((n,), float(i)) for i, n in enumerate(sizes)})


def test_sent_and_received_bytes_are_counted_exactly(address):
    """A server and two clients over grpc, each with its own endpoint: the
    server broadcasts to both, sends to client 1 alone, and each client
    replies; every byte and message counter matches what moved."""
    kw = dict(world_size=3, address=address, connect_timeout=120, metrics_port="auto")
    broadcasts = [message(1000, 24), message(1 << 16), message()]  # the last has no payload
    to_one = [message(3, 5, 7), message(1 << 12)]
    replies = {1: [message(10), message(20, 30)], 2: [message(1 << 10)]}
    with xsilo.Transport("grpc", rank=0, **kw) as server, \
            xsilo.Transport("grpc", rank=1, **kw) as c1, \
            xsilo.Transport("grpc", rank=2, **kw) as c2:
        clients = {1: c1, 2: c2}
        for m in broadcasts:
            server.broadcast([1, 2], m, timeout=120)
        for m in to_one:
            server.send(1, m, timeout=120)
        for r, c in clients.items():
            for _ in range(len(broadcasts) + (len(to_one) if r == 1 else 0)):
                c.receive(timeout=120)
            for m in replies[r]:
                c.send(0, m, timeout=120)
        for _ in range(sum(len(v) for v in replies.values())):
            server.receive(timeout=120)

        def nbytes(ms):
            return sum(4 * t.shape[0] for m in ms for t in m.tensors.values())

        s = samples(scrape(server.metrics_url))
        for peer in (1, 2):
            out = broadcasts + (to_one if peer == 1 else [])
            assert value(s, "xsilo_transport_sent_bytes_total", "server", peer) == nbytes(out)
            assert value(s, "xsilo_transport_sent_messages_total", "server", peer) == len(out)
            assert value(s, "xsilo_transport_send_errors_total", "server", peer) == 0
            assert value(s, "xsilo_transport_send_seconds_total", "server", peer) > 0
            assert value(s, "xsilo_transport_received_bytes_total", "server",
                         peer) == nbytes(replies[peer])
            assert value(s, "xsilo_transport_received_messages_total", "server",
                         peer) == len(replies[peer])
        for r, c in clients.items():
            cs = samples(scrape(c.metrics_url))
            got = broadcasts + (to_one if r == 1 else [])
            party = f"client {r}"
            assert value(cs, "xsilo_transport_received_bytes_total", party, 0) == nbytes(got)
            assert value(cs, "xsilo_transport_received_messages_total", party, 0) == len(got)
            assert value(cs, "xsilo_transport_sent_bytes_total", party, 0) == nbytes(replies[r])
            assert value(cs, "xsilo_transport_sent_messages_total", party, 0) == len(replies[r])
            # Only the server is a peer of a client.
            assert {dict(k[1])["peer"] for k in cs} == {"0"}

        # metrics_text() is what the endpoint serves (nothing moved since).
        text = server.metrics_text()
        assert text == scrape(server.metrics_url)
        for name in ["sent_bytes_total", "sent_messages_total", "send_errors_total",
                     "send_seconds_total", "received_bytes_total", "received_messages_total"]:
            assert f"# TYPE xsilo_transport_{name} counter\n" in text
        assert "# TYPE xsilo_transport_goodput_bytes_per_second gauge\n" in text


def test_a_fixed_port_an_address_and_a_party(address):
    port = free_port()
    with xsilo.Transport("grpc", rank=0, world_size=2, address=address, metrics_port=port,
                         metrics_address="127.0.0.1", metrics_party="aggregator") as t:
        assert t.metrics_url == f"http://127.0.0.1:{port}/metrics"
        # Nothing moved yet: no series, but a valid (empty) exposition.
        assert samples(scrape(t.metrics_url)) == {}
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/other", timeout=30)
        assert e.value.code == 404
        with xsilo.Transport("grpc", rank=1, world_size=2, address=address) as client:
            t.send(1, message(256), timeout=120)
            client.receive(timeout=120)
        s = samples(scrape(t.metrics_url))
        assert value(s, "xsilo_transport_sent_bytes_total", "aggregator", 1) == 1024


def test_metrics_without_an_endpoint():
    """metrics=True counts (inproc here) without serving anything."""
    a = xsilo.Transport("inproc", rank=0, world_size=2, address="py-metrics-1", metrics=True)
    b = xsilo.Transport("inproc", rank=1, world_size=2, address="py-metrics-1", metrics=True)
    with a, b:
        assert a.metrics_url is None and b.metrics_url is None
        a.send(1, message(100, 28), timeout=60)
        b.receive(timeout=60)
        sa, sb = samples(a.metrics_text()), samples(b.metrics_text())
        assert value(sa, "xsilo_transport_sent_bytes_total", "server", 1, "inproc") == 512
        assert value(sb, "xsilo_transport_received_bytes_total", "client 1", 0, "inproc") == 512
        assert value(sb, "xsilo_transport_received_messages_total", "client 1", 0, "inproc") == 1


@pytest.mark.parametrize("port", [None, 0, "0", ""])
def test_metrics_off(port):
    t = xsilo.Transport("inproc", address="py-metrics-off", metrics_port=port)
    assert t.metrics_url is None
    assert t.metrics_text() is None
    assert xsilo.Transport("inproc", address="py-metrics-off-2").metrics_text() is None


@pytest.mark.parametrize("port", [-1, 65536, 10**30, "eighty", "80x", 80.0, True, [8080]])
def test_a_bad_metrics_port_is_a_value_error(port):
    with pytest.raises(ValueError, match="metrics_port") as e:
        xsilo.Transport("inproc", metrics_port=port)
    if not isinstance(port, (int, str)) or isinstance(port, bool):
        assert repr(port) in str(e.value)
    else:
        assert "1..65535" in str(e.value) and str(port) in str(e.value)


def test_bad_metrics_address_and_party_are_value_errors():
    with pytest.raises(ValueError, match="'localhost' is not an IPv4 literal"):
        xsilo.Transport("inproc", metrics_port="auto", metrics_address="localhost")
    with pytest.raises(ValueError, match="metrics_party"):
        xsilo.Transport("inproc", metrics=True, metrics_party="")


def test_a_port_in_use_is_an_unavailable_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(xsilo.UnavailableError, match=f"127.0.0.1:{port}"):
            xsilo.Transport("inproc", metrics_port=port)


def test_the_endpoint_serves_after_stop_until_the_transport_is_gone(address):
    t = xsilo.Transport("grpc", rank=0, world_size=2, address=address, metrics_port="auto")
    t.start()
    url = t.metrics_url
    t.stop()
    assert scrape(url) == t.metrics_text()
    del t
    gc.collect()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=30)


class AddRank(xsilo.fl.Trainer):
    """Parameters: one float32 vector of 1000; training adds the rank."""

    def __init__(self, rank):
        super().__init__()
        self.rank = rank
        self.w = torch.zeros(1000)

    def get_parameters(self):
        return {"w": self.w.clone()}

    def set_parameters(self, tensors):
        self.w = tensors["w"].torch().clone()

    def train(self, epochs, steps):
        self.w += self.rank
        return {"samples": self.rank, "loss": 1.0}

    def evaluate(self):
        return {"loss": 1.0, "accuracy": 0.5, "samples": 1}


def test_a_fedavg_job_over_metered_transports_counts_what_its_report_says():
    """As docs/metrics.md says of `xsilo fl server`: the server's byte
    counters are the job report's bytes_sent / bytes_received, plus the
    final model that the finish message carries to each client. Every
    client answers every round (quorum 1: no update arrives late), and the
    counters are read after stop(), when every send has completed."""
    model_bytes = 4 * 1000
    ts = [xsilo.Transport("inproc", rank=r, world_size=3, address="py-metrics-fl", metrics=True)
          for r in range(3)]
    for t in ts:
        t.start()
    results = {}
    threads = [threading.Thread(target=lambda r=r: results.update(
        {r: xsilo.fl.run_client(ts[r], AddRank(r), idle_timeout=60)})) for r in (1, 2)]
    for th in threads:
        th.start()
    try:
        job = xsilo.fl.run_server(ts[0], {"w": torch.zeros(1000)}, rounds=3, quorum=1.0)
    finally:
        for th in threads:
            th.join()
        for t in ts:
            t.stop()
    assert all(results[r]["finished"] and results[r]["rounds_trained"] == 3 for r in (1, 2))
    assert sum(r["bytes_sent"] for r in job["rounds"]) == 3 * 2 * model_bytes
    assert sum(r["bytes_received"] for r in job["rounds"]) == 3 * 2 * model_bytes
    s = samples(ts[0].metrics_text())
    for peer in (1, 2):
        assert value(s, "xsilo_transport_sent_bytes_total", "server", peer,
                     "inproc") == 4 * model_bytes  # 3 rounds and the finish
        assert value(s, "xsilo_transport_received_bytes_total", "server", peer,
                     "inproc") == 3 * model_bytes
        assert value(s, "xsilo_transport_send_errors_total", "server", peer, "inproc") == 0
    for r in (1, 2):
        c = samples(ts[r].metrics_text())
        assert value(c, "xsilo_transport_received_bytes_total", f"client {r}", 0,
                     "inproc") == 4 * model_bytes
