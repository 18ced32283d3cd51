// xsilo.Tensor and xsilo.Message: tensors cross the boundary without copies.
//
// In: a torch.Tensor is taken through DLPack (its memory is borrowed, the
// DLPack deleter runs when the last Buffer view dies); any other object
// through the buffer protocol (numpy arrays, bytes, memoryview), holding
// the Py_buffer until then. Out: an xsilo.Tensor exports DLPack (torch) and
// a read-only buffer (numpy), both viewing the Tensor's Buffer and keeping
// it alive.
#include <dlpack/dlpack.h>
#include <pybind11/stl.h>

#include <cstring>
#include <sstream>

#include "common.h"

namespace xsilo::python {

namespace {

constexpr const char* kCapsuleName = "dltensor";
constexpr const char* kUsedCapsuleName = "used_dltensor";

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::ostringstream out;
  out << "(";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << (shape.size() == 1 ? ",)" : ")");
  return out.str();
}

DType DTypeArg(const std::string& name) {
  auto parsed = ParseDType(name);
  if (!parsed.ok()) {
    throw py::value_error("unknown dtype '" + name +
                          "' (expected one of F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL)");
  }
  return *parsed;
}

// The dtype a caller names for elements of `element_bytes` bytes (e.g.
// "BF16" for bfloat16 bits held as uint16). ValueError on a size mismatch.
DType OverrideDType(const std::string& name, uint64_t element_bytes) {
  DType d = DTypeArg(name);
  if (DTypeSize(d) != element_bytes) {
    throw py::value_error("dtype " + name + " does not match the input's " +
                          std::to_string(element_bytes) + "-byte elements");
  }
  return d;
}

// DLPack (code, bits) -> DType. BOOL travels as 8-bit unsigned in DLPack 0.6
// (no bool code), so `hint` (from the producer's own dtype) disambiguates.
DType FromDlDataType(DLDataType t, const std::optional<std::string>& hint) {
  if (t.lanes != 1) throw py::value_error("vector dtypes (DLPack lanes != 1) are not supported");
  std::optional<DType> d;
  switch (t.code) {
    case kDLFloat:
      if (t.bits == 64) d = DType::kF64;
      if (t.bits == 32) d = DType::kF32;
      if (t.bits == 16) d = DType::kF16;
      break;
    case kDLBfloat:
      if (t.bits == 16) d = DType::kBF16;
      break;
    case kDLInt:
      if (t.bits == 64) d = DType::kI64;
      if (t.bits == 32) d = DType::kI32;
      if (t.bits == 16) d = DType::kI16;
      if (t.bits == 8) d = DType::kI8;
      break;
    case kDLUInt:
      if (t.bits == 8) d = DType::kU8;
      break;
    case 6:  // kDLBool in DLPack >= 0.8
      if (t.bits == 8) d = DType::kBool;
      break;
    default:
      break;
  }
  if (!d) {
    throw py::value_error("unsupported dtype (DLPack code " + std::to_string(t.code) + ", " +
                          std::to_string(t.bits) +
                          " bits): xsilo carries the safetensors dtypes F64 F32 F16 BF16 I64 I32 "
                          "I16 I8 U8 BOOL");
  }
  return hint ? OverrideDType(*hint, DTypeSize(*d)) : *d;
}

DLDataType ToDlDataType(DType d) {
  DLDataType t{kDLFloat, 8, 1};
  switch (d) {
    case DType::kF64:
      t = {kDLFloat, 64, 1};
      break;
    case DType::kF32:
      t = {kDLFloat, 32, 1};
      break;
    case DType::kF16:
      t = {kDLFloat, 16, 1};
      break;
    case DType::kBF16:
      t = {kDLBfloat, 16, 1};
      break;
    case DType::kI64:
      t = {kDLInt, 64, 1};
      break;
    case DType::kI32:
      t = {kDLInt, 32, 1};
      break;
    case DType::kI16:
      t = {kDLInt, 16, 1};
      break;
    case DType::kI8:
      t = {kDLInt, 8, 1};
      break;
    case DType::kU8:
      t = {kDLUInt, 8, 1};
      break;
    case DType::kBool:
      t = {kDLUInt, 8, 1};
      break;  // DLPack 0.6 has no bool
  }
  return t;
}

// True when `strides` (in elements) describe a C-contiguous layout of
// `shape`; dims of extent 1 may carry any stride.
bool IsCContiguous(const std::vector<int64_t>& shape, const int64_t* strides) {
  if (strides == nullptr) return true;
  int64_t expected = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] == 0) return true;
    if (shape[i] != 1 && strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

Tensor MakeTensor(DType dtype, std::vector<int64_t> shape, Buffer data) {
  auto made = Tensor::Make(dtype, std::move(shape), std::move(data));
  if (!made.ok()) throw py::value_error(made.status().message());
  return std::move(made).value();
}

// Takes ownership of the DLManagedTensor inside `capsule` (renaming the
// capsule so that its producer's destructor leaves it alone).
Tensor FromDlpackCapsule(const py::capsule& capsule, const std::optional<std::string>& dtype,
                         const std::string& what) {
  if (std::strcmp(capsule.name(), kCapsuleName) != 0) {
    throw py::value_error(what + ": not a DLPack capsule, or one already consumed");
  }
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), kCapsuleName));
  if (managed == nullptr) throw py::error_already_set();
  // From here the capsule no longer owns `managed`; every path below must
  // end in the Buffer's release or in an explicit deleter call.
  PyCapsule_SetName(capsule.ptr(), kUsedCapsuleName);
  std::vector<int64_t> shape;
  DType d = DType::kU8;
  uint64_t nbytes = 0;
  try {
    const DLTensor& t = managed->dl_tensor;
    if (t.device.device_type != kDLCPU) {
      throw py::value_error(what + " lives on a device (DLPack device type " +
                            std::to_string(t.device.device_type) +
                            "); move it to the CPU first (tensor.cpu())");
    }
    if (t.ndim < 0) throw py::value_error(what + ": negative ndim");
    shape.assign(t.shape, t.shape + t.ndim);
    d = FromDlDataType(t.dtype, dtype);
    if (!IsCContiguous(shape, t.strides)) {
      throw py::value_error(what + " of shape " + ShapeText(shape) +
                            " is not contiguous; call .contiguous() first");
    }
    auto count = ElementCount(shape);
    if (!count) throw py::value_error(what + ": bad shape " + ShapeText(shape));
    nbytes = *count * DTypeSize(d);
  } catch (...) {
    if (managed->deleter) managed->deleter(managed);
    throw;
  }
  auto* data = static_cast<uint8_t*>(managed->dl_tensor.data) + managed->dl_tensor.byte_offset;
  // From here the Buffer's release owns `managed`.
  Buffer bytes = Buffer::Wrap(data, nbytes, [managed] {
    if (!managed->deleter) return;
    // Producers' deleters may touch Python objects (numpy's does).
    if (!Py_IsInitialized() || _Py_IsFinalizing()) return;
    PyGILState_STATE gil = PyGILState_Ensure();
    managed->deleter(managed);
    PyGILState_Release(gil);
  });
  return MakeTensor(d, std::move(shape), std::move(bytes));
}

// A struct-module format character (with an optional native/little-endian
// prefix) and item size -> DType.
std::optional<DType> FromBufferFormat(std::string_view format, ssize_t itemsize) {
  if (!format.empty() && (format[0] == '<' || format[0] == '@' || format[0] == '=')) {
    format.remove_prefix(1);
  }
  if (format.size() != 1) return std::nullopt;
  switch (format[0]) {
    case 'd':
      return DType::kF64;
    case 'f':
      return DType::kF32;
    case 'e':
      return DType::kF16;
    case 'b':
      return DType::kI8;
    case 'B':
      return DType::kU8;
    case 'c':
      return DType::kU8;
    case '?':
      return DType::kBool;
    case 'h':
      return DType::kI16;
    case 'i':
    case 'l':
    case 'q':
      if (itemsize == 8) return DType::kI64;
      if (itemsize == 4) return DType::kI32;
      return std::nullopt;
    default:
      return std::nullopt;
  }
}

Tensor FromBufferProtocol(const py::handle& obj, const std::optional<std::string>& dtype) {
  auto view = std::make_unique<Py_buffer>();
  if (PyObject_GetBuffer(obj.ptr(), view.get(), PyBUF_RECORDS_RO) != 0) {
    PyErr_Clear();
    throw py::value_error(std::string("cannot make a tensor of a ") + Py_TYPE(obj.ptr())->tp_name +
                          ": expected a torch.Tensor, a numpy array or a buffer");
  }
  Py_buffer* raw = view.release();
  std::vector<int64_t> shape;
  std::optional<DType> d;
  try {
    shape.assign(raw->shape, raw->shape + raw->ndim);
    if (!PyBuffer_IsContiguous(raw, 'C')) {
      throw py::value_error(std::string("array of shape ") + ShapeText(shape) +
                            " is not C-contiguous; use numpy.ascontiguousarray first");
    }
    std::string_view format = raw->format ? raw->format : "B";
    d = FromBufferFormat(format, raw->itemsize);
    if (dtype) d = OverrideDType(*dtype, static_cast<uint64_t>(raw->itemsize));
    if (!d) {
      throw py::value_error("unsupported array item format '" + std::string(format) +
                            "': xsilo carries F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL "
                            "(pass dtype='BF16' for bfloat16 bits held as uint16)");
    }
  } catch (...) {
    PyBuffer_Release(raw);
    delete raw;
    throw;
  }
  auto* data = static_cast<uint8_t*>(raw->buf);
  const uint64_t nbytes = static_cast<uint64_t>(raw->len);
  // From here the Buffer's release owns `raw`.
  Buffer bytes = Buffer::Wrap(data, nbytes, [raw] {
    if (!Py_IsInitialized() || _Py_IsFinalizing()) return;
    PyGILState_STATE gil = PyGILState_Ensure();
    PyBuffer_Release(raw);
    PyGILState_Release(gil);
    delete raw;
  });
  return MakeTensor(*d, std::move(shape), std::move(bytes));
}

bool IsTorchTensor(const py::handle& obj) {
  py::handle type = py::type::handle_of(obj);
  std::string module = py::str(type.attr("__module__"));
  return module.rfind("torch", 0) == 0 && py::hasattr(obj, "__dlpack__");
}

// The torch dtype name -> xsilo name, where DLPack alone cannot tell.
std::optional<std::string> TorchDTypeHint(const py::handle& obj) {
  std::string name = py::str(obj.attr("dtype"));
  if (name == "torch.bool") return std::string("BOOL");
  return std::nullopt;
}

const char* BufferFormat(DType d) {
  switch (d) {
    case DType::kF64:
      return "d";
    case DType::kF32:
      return "f";
    case DType::kF16:
      return "e";
    case DType::kBF16:
      return "H";  // numpy has no bfloat16: the raw bits
    case DType::kI64:
      return "q";
    case DType::kI32:
      return "i";
    case DType::kI16:
      return "h";
    case DType::kI8:
      return "b";
    case DType::kU8:
      return "B";
    case DType::kBool:
      return "?";
  }
  return "B";
}

// What a DLPack capsule handed to a consumer owns: a view of the Buffer.
struct ExportedTensor {
  DLManagedTensor managed{};
  Buffer keep;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
};

// A valid address for zero-byte tensors (consumers reject null data).
alignas(64) uint8_t g_empty_storage[64];

py::capsule ToDlpack(const Tensor& tensor) {
  auto* exported = new ExportedTensor();
  exported->keep = tensor.data;
  exported->shape = tensor.shape;
  exported->strides.resize(tensor.shape.size());
  int64_t stride = 1;
  for (size_t i = tensor.shape.size(); i-- > 0;) {
    exported->strides[i] = stride;
    stride *= std::max<int64_t>(tensor.shape[i], 1);
  }
  DLTensor& t = exported->managed.dl_tensor;
  t.data = tensor.data.empty() ? g_empty_storage : tensor.data.mutable_data();
  t.device = {kDLCPU, 0};
  t.ndim = static_cast<int32_t>(tensor.shape.size());
  t.dtype = ToDlDataType(tensor.dtype);
  t.shape = exported->shape.data();
  t.strides = exported->strides.data();
  t.byte_offset = 0;
  exported->managed.manager_ctx = exported;
  exported->managed.deleter = [](DLManagedTensor* self) {
    delete static_cast<ExportedTensor*>(self->manager_ctx);
  };
  // A capsule never consumed still frees its tensor.
  PyObject* capsule = PyCapsule_New(&exported->managed, kCapsuleName, [](PyObject* cap) {
    if (PyCapsule_IsValid(cap, kCapsuleName)) {
      auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, kCapsuleName));
      if (m && m->deleter) m->deleter(m);
    }
  });
  if (capsule == nullptr) {
    delete exported;
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::capsule>(capsule);
}

}  // namespace

Tensor TensorFromPython(const py::handle& obj, const std::optional<std::string>& dtype) {
  if (py::isinstance<PyTensor>(obj)) {
    Tensor t = obj.cast<const PyTensor&>().tensor;
    if (dtype) t.dtype = OverrideDType(*dtype, DTypeSize(t.dtype));
    return t;
  }
  if (PyCapsule_CheckExact(obj.ptr())) {
    return FromDlpackCapsule(py::reinterpret_borrow<py::capsule>(obj), dtype, "DLPack tensor");
  }
  if (IsTorchTensor(obj)) {
    py::object t = py::reinterpret_borrow<py::object>(obj);
    if (t.attr("requires_grad").cast<bool>()) t = t.attr("detach")();  // shares memory
    std::optional<std::string> hint = dtype ? dtype : TorchDTypeHint(t);
    // torch's DLPack export refuses bool: take the same bytes as uint8.
    if (hint && *hint == "BOOL") t = t.attr("view")(py::module_::import("torch").attr("uint8"));
    if (py::str(t.attr("device").attr("type")).cast<std::string>() != "cpu") {
      throw py::value_error("tensor is on " + py::str(t.attr("device")).cast<std::string>() +
                            "; move it to the CPU first (tensor.cpu())");
    }
    if (t.attr("is_sparse").cast<bool>()) {
      throw py::value_error("sparse tensors are not supported; call .to_dense() first");
    }
    return FromDlpackCapsule(t.attr("__dlpack__")(), hint, "tensor");
  }
  return FromBufferProtocol(obj, dtype);
}

py::dict TensorsToPython(const TensorMap& tensors) {
  py::dict out;
  for (const auto& [name, t] : tensors) out[py::str(name)] = PyTensor{t};
  return out;
}

TensorMap TensorsFromPython(const py::handle& mapping) {
  TensorMap out;
  if (mapping.is_none()) return out;
  if (!py::isinstance<py::dict>(mapping) && !py::hasattr(mapping, "items")) {
    throw py::value_error("tensors must be a mapping of name -> tensor");
  }
  for (auto item : mapping.attr("items")()) {
    auto pair = item.cast<py::tuple>();
    if (!py::isinstance<py::str>(pair[0])) throw py::value_error("tensor names must be str");
    std::string name = pair[0].cast<std::string>();
    try {
      out[name] = TensorFromPython(pair[1], std::nullopt);
    } catch (py::value_error& e) {
      throw py::value_error("tensor '" + name + "': " + e.what());
    }
  }
  return out;
}

ParamValue ParamFromPython(const py::handle& value, const std::string& key) {
  // bool is an int in Python; store it as one.
  if (py::isinstance<py::str>(value)) return value.cast<std::string>();
  if (py::isinstance<py::bool_>(value)) return static_cast<int64_t>(value.cast<bool>());
  if (py::isinstance<py::int_>(value)) {
    try {
      return value.cast<int64_t>();
    } catch (py::cast_error&) {
      throw py::value_error("parameter '" + key + "' does not fit in 64 bits");
    }
  }
  if (py::isinstance<py::float_>(value)) return value.cast<double>();
  if (py::isinstance<py::bytes>(value) || py::isinstance<py::bytearray>(value)) {
    std::string s = py::isinstance<py::bytes>(value)
                        ? value.cast<std::string>()
                        : std::string(PyByteArray_AsString(value.ptr()),
                                      static_cast<size_t>(PyByteArray_Size(value.ptr())));
    return Bytes(s.begin(), s.end());
  }
  throw py::value_error("parameter '" + key + "' must be str, int, float or bytes, not " +
                        std::string(Py_TYPE(value.ptr())->tp_name));
}

py::object ParamToPython(const ParamValue& value) {
  return std::visit(
      [](const auto& v) -> py::object {
        using V = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<V, Bytes>) {
          return py::bytes(reinterpret_cast<const char*>(v.data()), v.size());
        } else {
          return py::cast(v);
        }
      },
      value);
}

void RegisterTensors(py::module_& m) {
  py::class_<PyTensor>(m, "Tensor", py::buffer_protocol(), R"doc(
A tensor xsilo moves: dtype, shape and bytes, with no copy on the way in
or out. Build one with xsilo.tensor(x) from a torch.Tensor or a numpy
array (the memory is borrowed, not copied); read one with .torch() or
.numpy() (views of the bytes, which keep them alive).)doc")
      .def(py::init([](const py::object& obj, std::optional<std::string> dtype) {
             return PyTensor{TensorFromPython(obj, dtype)};
           }),
           py::arg("obj"), py::arg("dtype") = py::none())
      .def_property_readonly(
          "dtype", [](const PyTensor& t) { return std::string(DTypeName(t.tensor.dtype)); })
      .def_property_readonly("shape",
                             [](const PyTensor& t) {
                               py::tuple out(t.tensor.shape.size());
                               for (size_t i = 0; i < t.tensor.shape.size(); ++i) {
                                 out[i] = t.tensor.shape[i];
                               }
                               return out;
                             })
      .def_property_readonly("nbytes", [](const PyTensor& t) { return t.tensor.nbytes(); })
      .def_property_readonly(
          "data_ptr",
          [](const PyTensor& t) { return reinterpret_cast<uintptr_t>(t.tensor.data.data()); },
          "Address of the first byte.")
      .def_property_readonly(
          "storage",
          [](const PyTensor& t) {
            auto s = t.tensor.data.storage_span();
            return py::make_tuple(reinterpret_cast<uintptr_t>(s.data()), s.size());
          },
          "(address, length) of the whole Buffer this tensor is a view of: for a received "
          "message, the received bytes.")
      .def(
          "__dlpack__",
          [](const PyTensor& t, const py::object& stream) {
            if (!stream.is_none()) {
              throw py::value_error("xsilo tensors live on the CPU; stream must be None");
            }
            return ToDlpack(t.tensor);
          },
          py::arg("stream") = py::none())
      .def("__dlpack_device__", [](const PyTensor&) { return py::make_tuple(1, 0); })
      .def_buffer([](const PyTensor& t) {
        const Tensor& x = t.tensor;
        std::vector<ssize_t> shape(x.shape.begin(), x.shape.end());
        std::vector<ssize_t> strides(shape.size());
        ssize_t stride = static_cast<ssize_t>(DTypeSize(x.dtype));
        for (size_t i = shape.size(); i-- > 0;) {
          strides[i] = stride;
          stride *= std::max<ssize_t>(shape[i], 1);
        }
        void* data = x.data.empty() ? g_empty_storage : x.data.mutable_data();
        return py::buffer_info(data, static_cast<ssize_t>(DTypeSize(x.dtype)),
                               BufferFormat(x.dtype), static_cast<ssize_t>(shape.size()), shape,
                               strides, /*readonly=*/true);
      })
      .def("__repr__", [](const PyTensor& t) {
        return "xsilo.Tensor(dtype=" + std::string(DTypeName(t.tensor.dtype)) +
               ", shape=" + ShapeText(t.tensor.shape) + ")";
      });

  py::class_<Message>(m, "Message", R"doc(
A message: a small header (type, round, sender, receivers, params) and a
dict of named tensors. Tensors are views; building, sending and receiving
a Message never copies tensor bytes.)doc")
      .def(py::init([](std::string type, int64_t round, const py::object& params,
                       const py::object& tensors) {
             Message msg;
             msg.type = std::move(type);
             msg.round = round;
             if (!params.is_none()) {
               for (auto item : params.cast<py::dict>()) {
                 std::string key = py::str(item.first);
                 msg.params[key] = ParamFromPython(item.second, key);
               }
             }
             msg.tensors = TensorsFromPython(tensors);
             return msg;
           }),
           py::arg("type") = "", py::arg("round") = 0, py::arg("params") = py::none(),
           py::arg("tensors") = py::none())
      .def_readwrite("type", &Message::type)
      .def_readwrite("round", &Message::round)
      .def_readonly("sender", &Message::sender)
      .def_readonly("receivers", &Message::receivers)
      .def_property(
          "params",
          [](const Message& msg) {
            py::dict out;
            for (const auto& [k, v] : msg.params) out[py::str(k)] = ParamToPython(v);
            return out;
          },
          [](Message& msg, const py::dict& params) {
            msg.params.clear();
            for (auto item : params) {
              std::string key = py::str(item.first);
              msg.params[key] = ParamFromPython(item.second, key);
            }
          })
      .def_property(
          "tensors", [](const Message& msg) { return TensorsToPython(msg.tensors); },
          [](Message& msg, const py::object& tensors) { msg.tensors = TensorsFromPython(tensors); })
      .def(
          "set_tensor",
          [](Message& msg, const std::string& name, const py::object& value,
             std::optional<std::string> dtype) {
            msg.tensors[name] = TensorFromPython(value, dtype);
          },
          py::arg("name"), py::arg("value"), py::arg("dtype") = py::none())
      .def_property_readonly("payload_bytes", &Message::payload_bytes)
      .def("__repr__", [](const Message& msg) {
        return "xsilo.Message(type='" + msg.type + "', round=" + std::to_string(msg.round) +
               ", sender=" + std::to_string(msg.sender) +
               ", tensors=" + std::to_string(msg.tensors.size()) +
               ", payload_bytes=" + std::to_string(msg.payload_bytes()) + ")";
      });
}

}  // namespace xsilo::python
