"""Tensors cross the Python boundary without copies, both ways."""

import gc

import numpy as np
import pytest
import torch

import xsilo

MB = 1 << 20


def test_torch_tensor_is_borrowed_not_copied():
    t = torch.randn(1000, 100)
    x = xsilo.tensor(t)
    assert x.data_ptr == t.data_ptr()
    assert x.nbytes == t.numel() * 4
    # The xsilo tensor keeps the torch storage alive after the last Python name goes.
    ptr = t.data_ptr()
    expected = t.clone()
    del t
    gc.collect()
    assert x.data_ptr == ptr
    assert torch.equal(x.torch(), expected)


def test_numpy_array_is_borrowed_not_copied():
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    x = xsilo.tensor(a)
    assert x.data_ptr == a.ctypes.data
    assert x.dtype == "I32" and x.shape == (3, 4)


def test_views_out_share_the_tensor_bytes():
    x = xsilo.tensor(torch.arange(10, dtype=torch.float64))
    assert x.torch().data_ptr() == x.data_ptr
    view = x.numpy()
    assert view.ctypes.data == x.data_ptr
    assert not view.flags.writeable  # received bytes may be shared: numpy views are read-only


def test_message_tensors_share_the_state_dict_memory():
    sd = {"a.weight": torch.randn(4, 4), "a.bias": torch.randn(4)}
    msg = xsilo.Message.from_state_dict(sd, type="model", round=3)
    for name, t in sd.items():
        assert msg.tensors[name].data_ptr == t.data_ptr()
    back = msg.to_state_dict()
    for name, t in sd.items():
        assert back[name].data_ptr() == t.data_ptr()


def test_borrowed_tensor_outlives_its_python_owner_across_a_send(address):
    # A message whose only reference to the torch memory is xsilo's.
    with xsilo.Transport("grpc", rank=0, world_size=2, address=address) as server, \
            xsilo.Transport("grpc", rank=1, world_size=2, address=address) as client:
        msg = xsilo.Message.from_state_dict({"w": torch.full((1 << 16,), 7.0)})
        gc.collect()
        server.send(1, msg, timeout=60)
        del msg
        gc.collect()
        got = client.receive(timeout=60)
        assert torch.equal(got.to_state_dict()["w"], torch.full((1 << 16,), 7.0))


@pytest.mark.parametrize("backend", ["grpc", "grpc+s3"])
def test_big_send_does_not_copy_the_tensor_and_receiver_views_the_buffer(peers, address, backend):
    """256 MB from a sender process to a receiver process: the sender's peak
    RSS grows by < 10% of the payload; the received numpy array and torch
    tensor point inside the received Buffer."""
    nbytes = 256 * MB
    args = dict(transport=backend, world_size=2, address=address, nbytes=nbytes)
    sender = peers.start("send_big", **args)
    receiver = peers.start("receive_big", rank=1, **args)
    got = peers.report(receiver)
    sent = peers.report(sender)
    assert sent["clients_ok"]
    assert got["nbytes"] == nbytes and got["crc"] == sent["crc"]
    assert got["inside"], got
    assert got["readonly"]
    assert sent["growth"] < 0.10 * nbytes, (
        f"sender's RSS grew by {sent['growth'] / MB:.1f} MB sending {nbytes / MB:.0f} MB")
