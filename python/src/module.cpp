// The _xsilo extension module: xsilo's C++ engine for Python.
#include <Python.h>

#include <array>
#include <cmath>

#include "common.h"
#include "xsilo/core/codec.h"
#include "xsilo/hybrid/hybrid.h"
#include "xsilo/version.h"

namespace xsilo::python {

namespace {

constexpr int kCodeCount = static_cast<int>(StatusCode::kInternal) + 1;

// Exception classes by StatusCode (index 0, kOk, is unused). Module-lifetime
// objects: leaked on purpose so that no destructor runs after finalization.
std::array<PyObject*, kCodeCount>& ErrorClasses() {
  static std::array<PyObject*, kCodeCount> classes{};
  return classes;
}

struct ErrorSpec {
  StatusCode code;
  const char* name;
  PyObject* builtin;  // a second base so callers can catch the usual Python type, or null
};

}  // namespace

void RegisterErrors(py::module_& m) {
  PyObject* base = PyErr_NewExceptionWithDoc(
      "xsilo.Error",
      "An xsilo operation failed. .code is the status code's name ('Timeout', ...), "
      ".message its text.",
      PyExc_RuntimeError, nullptr);
  if (base == nullptr) throw py::error_already_set();
  m.add_object("Error", py::handle(base));
  const ErrorSpec specs[] = {
      {StatusCode::kInvalidArgument, "InvalidArgumentError", PyExc_ValueError},
      {StatusCode::kNotFound, "NotFoundError", PyExc_LookupError},
      {StatusCode::kAlreadyExists, "AlreadyExistsError", nullptr},
      {StatusCode::kCorrupt, "CorruptError", nullptr},
      {StatusCode::kTimeout, "TimeoutError", PyExc_TimeoutError},
      {StatusCode::kUnavailable, "UnavailableError", PyExc_ConnectionError},
      {StatusCode::kPermissionDenied, "PermissionDeniedError", PyExc_PermissionError},
      {StatusCode::kUnauthenticated, "UnauthenticatedError", nullptr},
      {StatusCode::kResourceExhausted, "ResourceExhaustedError", nullptr},
      {StatusCode::kCancelled, "CancelledError", nullptr},
      {StatusCode::kFailedPrecondition, "FailedPreconditionError", nullptr},
      {StatusCode::kOutOfRange, "OutOfRangeError", PyExc_IndexError},
      {StatusCode::kUnimplemented, "UnimplementedError", PyExc_NotImplementedError},
      {StatusCode::kInternal, "InternalError", nullptr},
  };
  for (const ErrorSpec& spec : specs) {
    std::string qualified = std::string("xsilo.") + spec.name;
    py::tuple bases = spec.builtin ? py::make_tuple(py::handle(base), py::handle(spec.builtin))
                                   : py::make_tuple(py::handle(base));
    PyObject* cls = PyErr_NewException(qualified.c_str(), bases.ptr(), nullptr);
    if (cls == nullptr) throw py::error_already_set();
    ErrorClasses()[static_cast<int>(spec.code)] = cls;
    Py_INCREF(cls);  // m.add_object steals one reference
    m.add_object(spec.name, py::handle(cls));
  }
  ErrorClasses()[0] = base;
}

void Raise(const Status& status) {
  int index = static_cast<int>(status.code());
  PyObject* cls = (index > 0 && index < kCodeCount && ErrorClasses()[index] != nullptr)
                      ? ErrorClasses()[index]
                      : ErrorClasses()[0];
  py::object exc = py::reinterpret_borrow<py::object>(cls)(status.ToString());
  exc.attr("code") = std::string(StatusCodeName(status.code()));
  exc.attr("message") = status.message();
  PyErr_SetObject(cls, exc.ptr());
  throw py::error_already_set();
}

Duration TimeoutArg(const std::optional<double>& seconds) {
  if (!seconds) return std::chrono::hours(24 * 365);
  if (!std::isfinite(*seconds) || *seconds < 0) {
    throw py::value_error("timeout must be a finite number of seconds >= 0, or None");
  }
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(*seconds * 1000.0)));
}

Buffer BorrowFromPython(void* data, uint64_t size, py::object owner) {
  PyObject* held = owner.release().ptr();  // our reference, dropped by the release
  return Buffer::Wrap(data, size, [held] {
    // The last view may die on a transport thread, or after the interpreter
    // began shutting down (then the object is leaked, not touched).
    if (!Py_IsInitialized() || _Py_IsFinalizing()) return;
    PyGILState_STATE gil = PyGILState_Ensure();
    Py_DECREF(held);
    PyGILState_Release(gil);
  });
}

}  // namespace xsilo::python

PYBIND11_MODULE(_xsilo, m) {
  using namespace xsilo::python;
  m.doc() = "xsilo: move large objects between the parties of federated applications";
  m.attr("__version__") = xsilo::kVersion;
  // The "<transport>+<connector>" backends (grpc+s3, ...): the hybrid
  // library's objects are linked in, but register explicitly all the same.
  xsilo::RegisterHybridTransports();
  RegisterErrors(m);
  RegisterTensors(m);
  RegisterTransport(m);
  RegisterStore(m);
  RegisterFl(m);
  m.def(
      "checksum",
      [](const py::object& obj) {
        xsilo::Tensor t = TensorFromPython(obj, std::nullopt);
        py::gil_scoped_release release;
        return xsilo::Checksum(t.data.span());
      },
      py::arg("tensor"),
      "XXH3-64 of a tensor's bytes (the checksum xsilo's wire format carries), read in place.");
}
