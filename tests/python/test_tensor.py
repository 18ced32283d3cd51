"""dtypes round trip exactly; bad input is a clear ValueError, never a crash."""

import numpy as np
import pytest
import torch

import xsilo

TORCH_DTYPES = [
    (torch.float64, "F64"), (torch.float32, "F32"), (torch.float16, "F16"),
    (torch.bfloat16, "BF16"), (torch.int64, "I64"), (torch.int32, "I32"),
    (torch.int16, "I16"), (torch.int8, "I8"), (torch.uint8, "U8"), (torch.bool, "BOOL"),
]
NUMPY_DTYPES = [
    (np.float64, "F64"), (np.float32, "F32"), (np.float16, "F16"), (np.int64, "I64"),
    (np.int32, "I32"), (np.int16, "I16"), (np.int8, "I8"), (np.uint8, "U8"), (np.bool_, "BOOL"),
]


def sample(dtype, shape=(3, 5)):
    """Values that exercise the dtype's range (extremes, negatives, fractions)."""
    g = torch.Generator().manual_seed(7)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point:
        t = (torch.randn(shape, generator=g, dtype=torch.float64) * 1e3).to(dtype)
        if t.numel() >= 2:
            t.view(-1)[0] = torch.finfo(dtype).max
            t.view(-1)[1] = torch.finfo(dtype).tiny
        return t
    info = torch.iinfo(dtype)
    t = torch.randint(info.min, info.max, shape, generator=g, dtype=torch.int64).to(dtype)
    if t.numel() >= 2:
        t.view(-1)[0], t.view(-1)[1] = info.min, info.max
    return t


def same_bits(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    return a.contiguous().view(torch.uint8).equal(b.contiguous().view(torch.uint8))


@pytest.mark.parametrize("dtype,name", TORCH_DTYPES)
def test_torch_dtypes_round_trip_through_a_transport(dtype, name):
    t = sample(dtype)
    msg = xsilo.Message.from_state_dict({"x": t, "scalar": sample(dtype, ())})
    assert msg.tensors["x"].dtype == name
    assert msg.tensors["scalar"].shape == ()
    with xsilo.Transport("inproc", rank=0, world_size=2, address=f"dtype-{name}") as a, \
            xsilo.Transport("inproc", rank=1, world_size=2, address=f"dtype-{name}") as b:
        a.send(1, msg, timeout=30)
        got = b.receive(timeout=30).to_state_dict()
    assert same_bits(got["x"], t)
    assert got["x"].dtype == dtype
    assert got["scalar"].shape == () and got["scalar"].dtype == dtype


@pytest.mark.parametrize("dtype,name", NUMPY_DTYPES)
def test_numpy_dtypes_round_trip(dtype, name):
    a = (np.arange(24) - 12).reshape(2, 3, 4).astype(dtype)
    x = xsilo.tensor(a)
    assert x.dtype == name and x.shape == (2, 3, 4)
    back = x.numpy()
    assert back.dtype == a.dtype and np.array_equal(back, a)


def test_bf16_from_numpy_bits_needs_an_explicit_dtype():
    t = torch.randn(8).to(torch.bfloat16)
    bits = t.view(torch.int16).numpy().view(np.uint16)
    x = xsilo.tensor(bits, dtype="BF16")
    assert x.dtype == "BF16"
    assert same_bits(x.torch(), t)
    assert x.numpy().dtype == np.uint16  # numpy has no bfloat16: its bits


def test_zero_size_and_many_dims():
    for shape in [(0,), (2, 0, 3), (1, 1, 1, 1, 1, 2)]:
        t = torch.ones(shape)
        x = xsilo.tensor(t)
        assert x.shape == shape and x.nbytes == t.numel() * 4
        assert x.torch().shape == shape


def test_message_header_round_trips():
    msg = xsilo.Message(type="update", round=7,
                        params={"s": "text", "i": -(1 << 62), "f": 0.25, "b": b"\x00\xff"})
    with xsilo.Transport("inproc", rank=0, world_size=2, address="hdr") as a, \
            xsilo.Transport("inproc", rank=1, world_size=2, address="hdr") as b:
        b.send(0, msg, timeout=30)
        got = a.receive(timeout=30)
    assert (got.type, got.round, got.sender) == ("update", 7, 1)
    assert got.params == {"s": "text", "i": -(1 << 62), "f": 0.25, "b": b"\x00\xff"}


@pytest.mark.parametrize("bad,match", [
    (lambda: torch.randn(4, 4).t(), "not contiguous"),
    (lambda: torch.randn(4, 4)[:, ::2], "not contiguous"),
    (lambda: np.zeros((4, 4))[:, 1:], "not C-contiguous"),
    (lambda: torch.zeros(3, dtype=torch.complex64), "unsupported dtype"),
    (lambda: np.zeros(3, dtype=np.complex128), "unsupported array item format"),
    (lambda: np.zeros(3, dtype=np.uint32), "unsupported array item format"),
    (lambda: torch.empty(3, device="meta"), "move it to the CPU"),
    (lambda: "a string", "cannot make a tensor"),
    (lambda: {"a": 1}, "cannot make a tensor"),
    (lambda: torch.zeros(3).to_sparse(), "sparse"),
])
def test_bad_tensors_raise_value_error(bad, match):
    with pytest.raises(ValueError, match=match):
        xsilo.tensor(bad())


def test_bad_dtype_overrides_raise_value_error():
    with pytest.raises(ValueError, match="unknown dtype"):
        xsilo.tensor(np.zeros(2, dtype=np.uint16), dtype="Q9")
    with pytest.raises(ValueError, match="does not match"):
        xsilo.tensor(np.zeros(2, dtype=np.float32), dtype="BF16")


def test_bad_message_fields_raise_value_error():
    with pytest.raises(ValueError, match="must be str, int, float or bytes"):
        xsilo.Message(params={"x": [1, 2]})
    with pytest.raises(ValueError, match="does not fit in 64 bits"):
        xsilo.Message(params={"x": 1 << 70})
    with pytest.raises(ValueError, match="tensor 'w'"):
        xsilo.Message(tensors={"w": torch.randn(3, 3).t()})
    with pytest.raises(ValueError, match="keys must be str"):
        xsilo.Message.from_state_dict({1: torch.zeros(1)})


def test_requires_grad_tensors_are_taken_detached():
    w = torch.randn(3, requires_grad=True)
    x = xsilo.tensor(w)
    assert x.data_ptr == w.data_ptr()
