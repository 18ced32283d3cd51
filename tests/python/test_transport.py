"""Transports by name from Python: options, timeouts, errors, the GIL."""

import threading

import pytest
import torch

import xsilo


def test_every_registered_backend_is_listed():
    names = xsilo.transports()
    for name in ["inproc", "grpc", "grpc+s3", "inproc+memory"]:
        assert name in names
    assert names["grpc"] is None  # viable here


def test_unknown_backend_and_bad_options_are_value_errors():
    with pytest.raises(ValueError, match="no transport named"):
        xsilo.Transport("carrier-pigeon")
    with pytest.raises(ValueError, match="unknown backend option 'bogus'"):
        xsilo.Transport("grpc", options={"bogus": 1})
    with pytest.raises(ValueError, match="outside"):
        xsilo.Transport("grpc", rank=3, world_size=2)
    with pytest.raises(ValueError, match="must be str, int, float or bool"):
        xsilo.Transport("grpc", options={"streams": [2]})
    with pytest.raises(ValueError, match="timeout"):
        xsilo.Transport("inproc", connect_timeout=-1)


def test_errors_carry_the_status_code_and_text(address):
    with xsilo.Transport("grpc", rank=0, world_size=2, address=address) as t:
        with pytest.raises(xsilo.TimeoutError) as e:
            t.receive(timeout=0.05)
        assert isinstance(e.value, TimeoutError)  # the builtin too
        assert isinstance(e.value, xsilo.Error)
        assert e.value.code == "Timeout" and e.value.message
        with pytest.raises(xsilo.InvalidArgumentError) as e:
            t.send(5, xsilo.Message(), timeout=1)
        assert e.value.code == "InvalidArgument" and "5" in e.value.message
        with pytest.raises(ValueError, match="timeout"):
            t.receive(timeout=float("nan"))


def test_stop_wakes_a_blocked_receiver_with_cancelled(address):
    t = xsilo.Transport("grpc", rank=0, world_size=2, address=address)
    t.start()
    errors = []

    def wait():
        try:
            t.receive(timeout=120)
        except xsilo.Error as e:
            errors.append(e)

    th = threading.Thread(target=wait)
    th.start()
    t.stop()
    th.join(timeout=120)
    assert not th.is_alive()
    assert errors and errors[0].code == "Cancelled"


def test_blocking_calls_release_the_gil(address):
    """While one thread waits in receive(), Python code runs in another and
    stops the transport, which ends the wait with Cancelled. If receive held
    the GIL, this thread could only run after the receive timed out (60 s),
    and the receiver would see Timeout instead."""
    t = xsilo.Transport("grpc", rank=0, world_size=2, address=address)
    t.start()
    waiting = threading.Event()
    errors = []

    def wait():
        waiting.set()
        try:
            t.receive(timeout=60)
        except xsilo.Error as e:
            errors.append(e.code)

    th = threading.Thread(target=wait)
    th.start()
    waiting.wait()
    total = sum(i for i in range(200000))  # Python work: needs the GIL
    t.stop()
    th.join()
    assert total == 199999 * 200000 // 2
    assert errors == ["Cancelled"]


@pytest.mark.parametrize("backend", ["grpc", "grpc+s3"])
def test_broadcast_and_echo_across_processes(peers, address, backend):
    """Rank 0 in this process, rank 1 in another that echoes what it gets."""
    peer = peers.start("echo", transport=backend, world_size=2, address=address)
    sd = {"w": torch.randn(1 << 20), "b": torch.arange(10, dtype=torch.int64)}
    with xsilo.Transport(backend, rank=0, world_size=2, address=address,
                         connect_timeout=120) as t:
        for r in range(3):
            t.broadcast([1], xsilo.Message.from_state_dict(sd, type="model", round=r), timeout=120)
            back = t.receive(timeout=120)
            assert back.round == r and back.sender == 1
            for k, v in back.to_state_dict().items():
                assert torch.equal(v, sd[k])
        # The echo stops as soon as it has this; its Stop still confirms it.
        t.send(1, xsilo.Message(type="stop"), timeout=120)
        assert peers.report(peer)["ok"]
