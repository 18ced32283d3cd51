"""Objects to parts and back: pickle protocol 5 with out-of-band buffers.

dumps(obj) returns the pickle stream and the large buffers found inside obj
(numpy arrays and torch CPU tensors at any depth; bytes and bytearrays of
64 KiB and more at the top and inside dicts, lists and tuples of up to 256
items, two levels down) without copying them; loads(stream, buffers) rebuilds the object around
those buffers (numpy arrays and torch tensors view them, no copy). Objects
the standard pickler refuses (lambdas, local classes) go through
cloudpickle when it is installed (Debian's python3-cloudpickle).

The xsilo Store keeps the parts as one safetensors object through the C++
engine (a gather write, no concatenation); pack/unpack frame them as one
bytes object for connectors written in Python.
"""

import io
import json
import pickle
import struct
import sys

try:  # Debian's python3-cloudpickle: lambdas, local classes, __main__ objects
    import cloudpickle
except ImportError:  # pragma: no cover - install-deps.sh installs it
    cloudpickle = None

# Buffers smaller than this stay inside the pickle stream: a separate part
# costs more than copying a few KiB.
INBAND_LIMIT = 64 << 10

_MAGIC = b"XSP5"
_ALIGN = 64


class SerializationError(ValueError):
    """An object that cannot be serialized (neither pickle nor cloudpickle)."""


# Rebuilt bytes objects of this size and more are copied by the extension,
# into memory advised for huge pages (see _xsilo._bytes_from).
_HUGE_COPY = 8 << 20


def _rebuild_bytes(buf):
    if type(buf) is bytes:  # read straight into a bytes object already
        return buf
    if memoryview(buf).nbytes >= _HUGE_COPY:
        from . import _xsilo

        return _xsilo._bytes_from(buf)
    return bytes(buf)


def _rebuild_torch(array, dtype, requires_grad, parameter):
    import warnings

    import torch

    with warnings.catch_warnings():
        # A tensor over fetched (read-only) bytes: torch has no read-only
        # tensors and says so; the bytes are the store's, see docs/python.md.
        warnings.simplefilter("ignore", UserWarning)
        t = torch.from_numpy(array)
    if dtype == "bfloat16":
        t = t.view(torch.bfloat16)
    if parameter:
        return torch.nn.Parameter(t, requires_grad=requires_grad)
    if requires_grad:
        t.requires_grad_(True)
    return t


def _torch_reduce(t):
    """(rebuild, args) carrying a CPU tensor's bytes as a numpy array, which
    pickle 5 sends out of band; None when the tensor is not a plain CPU one."""
    import torch

    if t.device.type != "cpu" or t.layout != torch.strided or t.is_quantized:
        return None
    parameter = isinstance(t, torch.nn.Parameter)
    requires_grad = t.requires_grad
    d = t.detach().contiguous()
    dtype = "bfloat16" if d.dtype == torch.bfloat16 else None
    if dtype:
        d = d.view(torch.int16)
    try:
        arr = d.numpy()
    except (TypeError, RuntimeError):
        return None
    return _rebuild_torch, (arr, dtype, requires_grad, parameter)


def _rebuild_bytearray(buf):
    return bytearray(buf)


class _BigBytes:
    """A large bytes or bytearray object, pickled out of band. The C pickler
    writes exact bytes and bytearray objects in band without asking
    reducer_override, so dumps() swaps them for this wrapper first (see
    _swap_bytes)."""

    __slots__ = ("b",)

    def __init__(self, b):
        self.b = b

    def __reduce__(self):
        rebuild = _rebuild_bytes if type(self.b) is bytes else _rebuild_bytearray
        return rebuild, (pickle.PickleBuffer(self.b),)


# How far dumps() looks into dicts, lists and tuples for large bytes objects.
_SWAP_DEPTH = 2
_SWAP_ITEMS = 256


def _swap_bytes(obj, depth=0):
    """obj with its large bytes and bytearray objects wrapped in _BigBytes: the object
    itself, and inside dicts, lists and tuples of at most 256 items down to
    two levels (deeper or larger containers are pickled as they are)."""
    t = type(obj)
    if t is bytes or t is bytearray:
        return _BigBytes(obj) if len(obj) >= INBAND_LIMIT else obj
    if depth >= _SWAP_DEPTH or t not in (dict, list, tuple) or len(obj) > _SWAP_ITEMS:
        return obj
    if t is dict:
        out = {k: _swap_bytes(v, depth + 1) for k, v in obj.items()}
        return out if any(out[k] is not v for k, v in obj.items()) else obj
    out = [_swap_bytes(v, depth + 1) for v in obj]
    if all(a is b for a, b in zip(out, obj)):
        return obj
    return t(out)


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj):
        t = type(obj)
        if t.__module__.startswith("torch") and "torch" in sys.modules:
            import torch

            if isinstance(obj, torch.Tensor) and t in (torch.Tensor, torch.nn.Parameter):
                r = _torch_reduce(obj)
                if r is not None:
                    return r
        return NotImplemented


def _collector(buffers):
    def callback(pb):
        try:
            raw = pb.raw()
        except BufferError:  # not contiguous: pickle copies it in band
            return True
        if raw.nbytes < INBAND_LIMIT:
            return True
        buffers.append(raw)
        return False

    return callback


def dumps(obj):
    """(stream, [buffers]) for obj. SerializationError when it cannot be pickled."""
    buffers = []
    f = io.BytesIO()
    try:
        _Pickler(f, protocol=5, buffer_callback=_collector(buffers)).dump(_swap_bytes(obj))
        return f.getbuffer(), buffers
    except Exception as e:  # pickle raises PicklingError, TypeError, AttributeError...
        first = e
    if cloudpickle is not None:
        buffers = []
        try:
            stream = cloudpickle.dumps(_swap_bytes(obj), protocol=5,
                                      buffer_callback=_collector(buffers))
            return memoryview(stream), buffers
        except Exception as e:
            raise SerializationError(
                f"cannot serialize {type(obj).__name__!r}: {e} (pickle: {first})") from e
    raise SerializationError(f"cannot serialize {type(obj).__name__!r}: {first}") from first


def loads(stream, buffers=()):
    """The object of dumps() rebuilt around buffers (viewed, not copied)."""
    return pickle.loads(stream, buffers=buffers)


def pack(stream, buffers):
    """One bytes object: magic, part count, part lengths, 64-byte-aligned parts."""
    parts = [stream] + list(buffers)
    lengths = [memoryview(p).nbytes for p in parts]
    header = _MAGIC + struct.pack(f"<I{len(parts)}Q", len(parts), *lengths)
    out = [header]
    pos = len(header)
    for p, n in zip(parts, lengths):
        pad = -pos % _ALIGN
        out.append(b"\0" * pad)
        out.append(p)
        pos += pad + n
    return b"".join(out)


def pack_segments(stream, buffers):
    """pack()'s bytes as a list of segments (no concatenation of the parts)."""
    parts = [stream] + list(buffers)
    lengths = [memoryview(p).nbytes for p in parts]
    header = _MAGIC + struct.pack(f"<I{len(parts)}Q", len(parts), *lengths)
    out = [header]
    pos = len(header)
    for p, n in zip(parts, lengths):
        pad = -pos % _ALIGN
        if pad:
            out.append(bytes(pad))
        out.append(p)
        pos += pad + n
    return out


def unpack(data):
    """(stream, [buffers]) of pack()'s output, as views of data."""
    mv = memoryview(data).cast("B")
    if bytes(mv[:4]) != _MAGIC:
        raise SerializationError("not an xsilo serialized object")
    (n,) = struct.unpack_from("<I", mv, 4)
    lengths = struct.unpack_from(f"<{n}Q", mv, 8)
    pos = 8 + 8 * n
    parts = []
    for length in lengths:
        pos += -pos % _ALIGN
        parts.append(mv[pos:pos + length])
        pos += length
    return parts[0], parts[1:]


def parts(stream, buffers):
    """The parts as a name -> buffer dict for the engine's safetensors codec:
    "p" the stream, "b000000"... the buffers, and where a buffer's length is
    not a multiple of 64 a zero "b000000_" after it, so that every buffer
    starts 64-byte aligned (the codec lays parts out in name order); "t",
    one byte per buffer, 1 where the buffer is an exact bytes object (left
    out when none is: see bytes_parts)."""
    out = {"p": stream}
    for i, b in enumerate(buffers):
        out[f"b{i:06d}"] = b
        pad = -b.nbytes % _ALIGN
        if pad:
            out[f"b{i:06d}_"] = bytes(pad)
    kinds = bytes(1 if type(getattr(b, "obj", None)) is bytes else 0 for b in buffers)
    if any(kinds):
        out["t"] = kinds
    return out


def bytes_parts(header):
    """For a parts() object's safetensors header (a dict): the (start, end)
    data offsets of part "t" (which parts() writes when a buffer came from
    an exact bytes object), of the stream and of each buffer; None without
    "t". When every byte of "t" is 1, a reader can read each buffer straight
    into a new bytes object, which pickle hands to the rebuild unchanged:
    one copy in all."""
    t = header.get("t")
    if t is None or "p" not in header:
        return None
    names = sorted(n for n in header if n.startswith("b") and not n.endswith("_"))
    a, b = t["data_offsets"]
    if b - a != len(names):
        return None
    return (a, b), header["p"]["data_offsets"], [header[n]["data_offsets"] for n in names]


def unparts(data):
    """(stream, [buffers]) from the bytes of parts() (a safetensors object) or
    of pack(), as views of data."""
    mv = memoryview(data).cast("B")
    if bytes(mv[:4]) == _MAGIC:
        return unpack(mv)
    (n,) = struct.unpack_from("<Q", mv, 0)
    header = json.loads(bytes(mv[8:8 + n]))
    base = 8 + n
    stream, buffers = None, []
    for name in sorted(header):
        if name == "p" or (name.startswith("b") and not name.endswith("_")):
            a, b = header[name]["data_offsets"]
            if not 0 <= a <= b or base + b > len(mv):
                raise SerializationError(
                    f"truncated object: part {name!r} ends at {base + b} of {len(mv)} bytes")
            if name == "p":
                stream = mv[base + a:base + b]
            else:
                buffers.append(mv[base + a:base + b])
    if stream is None:
        raise SerializationError("not an xsilo serialized object")
    return stream, buffers


def serialize(obj):
    """obj as one bytes object (ProxyStore's serialize())."""
    return pack(*dumps(obj))


def deserialize(data):
    """The object serialize() gave data for."""
    stream, buffers = unpack(data)
    return loads(stream, buffers)
