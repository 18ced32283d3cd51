"""xsilo: move large objects between the parties of federated applications.

The C++ engine (transports, stores, the FedAvg runtime) behind a small
Python API. Tensors cross the boundary without copies, both ways:

    import torch, xsilo
    msg = xsilo.Message.from_state_dict(model.state_dict(), type="model")
    with xsilo.Transport("grpc+s3", rank=0, world_size=3,
                         address="127.0.0.1:50051") as t:
        t.broadcast([1, 2], msg, timeout=60)

    # in a client process
    got = t.receive(timeout=60)
    model.load_state_dict(got.to_state_dict())

See docs/python.md.
"""

from collections import OrderedDict

from . import _xsilo
from ._xsilo import (  # noqa: F401  (re-exported)
    AlreadyExistsError,
    CancelledError,
    CorruptError,
    Error,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    Message,
    NotFoundError,
    OutOfRangeError,
    PermissionDeniedError,
    ResourceExhaustedError,
    Tensor,
    TimeoutError,
    Transport,
    UnauthenticatedError,
    UnavailableError,
    UnimplementedError,
    checksum,
    transports,
)
from . import fl  # noqa: F401
from .store import Proxy, Store  # noqa: F401

__version__ = _xsilo.__version__

_TORCH_TO_XSILO = {
    "torch.float64": "F64",
    "torch.float32": "F32",
    "torch.float16": "F16",
    "torch.bfloat16": "BF16",
    "torch.int64": "I64",
    "torch.int32": "I32",
    "torch.int16": "I16",
    "torch.int8": "I8",
    "torch.uint8": "U8",
    "torch.bool": "BOOL",
}


def tensor(obj, dtype=None):
    """An xsilo.Tensor that borrows obj's memory (no copy).

    obj: a contiguous CPU torch.Tensor (any safetensors dtype, bf16 and bool
    included), a C-contiguous numpy array, or any buffer. dtype overrides
    the element type when the producer cannot say it (e.g. "BF16" for
    bfloat16 bits held in a numpy uint16 array). ValueError for a
    non-contiguous, non-CPU or unsupported input.
    """
    return Tensor(obj, dtype)


def _to_torch(t):
    import torch
    import torch.utils.dlpack

    out = torch.utils.dlpack.from_dlpack(t)
    if t.dtype == "BOOL":  # DLPack 0.6 has no bool: it travels as uint8
        out = out.view(torch.bool)
    return out


def _to_numpy(t):
    """A read-only numpy view of t (bf16 appears as its uint16 bits)."""
    import numpy

    return numpy.asarray(t)


Tensor.torch = _to_torch
Tensor.torch.__doc__ = "A torch.Tensor viewing this tensor's bytes (no copy)."
Tensor.numpy = _to_numpy


def _from_state_dict(state_dict, type="model", round=0, params=None):
    """A Message whose tensors borrow state_dict's tensors (no copy)."""
    tensors = OrderedDict()
    for name, value in state_dict.items():
        if not isinstance(name, str):
            raise ValueError(f"state_dict keys must be str, not {name!r}")
        tensors[name] = value
    return Message(type=type, round=round, params=params, tensors=tensors)


def _to_state_dict(self):
    """An OrderedDict of name -> torch.Tensor viewing the message's bytes.

    Names come in sorted order (xsilo keeps tensors by name);
    model.load_state_dict() does not depend on the order. The tensors share
    the received bytes: load them into a model (which copies) or clone them
    before writing into them.
    """
    return OrderedDict((name, t.torch()) for name, t in self.tensors.items())


Message.from_state_dict = staticmethod(_from_state_dict)
Message.to_state_dict = _to_state_dict
