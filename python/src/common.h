// Shared pieces of the Python bindings: Status -> exception, timeouts,
// Buffers that borrow Python memory, and the per-file registration hooks.
#pragma once

#include <pybind11/pybind11.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "xsilo/core/buffer.h"
#include "xsilo/core/message.h"
#include "xsilo/core/status.h"
#include "xsilo/metrics/endpoint.h"
#include "xsilo/metrics/metrics.h"
#include "xsilo/transport/transport.h"

namespace xsilo::python {

namespace py = pybind11;

// Creates xsilo.Error and one subclass per StatusCode (xsilo.InvalidArgument,
// xsilo.Timeout, ...). Call once at module init.
void RegisterErrors(py::module_& m);

// Raises the exception class of `status.code()`, carrying .code (the code's
// name) and .message. Never returns. The GIL must be held.
[[noreturn]] void Raise(const Status& status);

inline void Check(const Status& status) {
  if (!status.ok()) Raise(status);
}
template <typename T>
T Check(Result<T> result) {
  if (!result.ok()) Raise(result.status());
  return std::move(result).value();
}

// A Python `timeout` argument (seconds, None = wait "forever", i.e. a
// year) as a Duration. ValueError for a negative or non-finite value.
Duration TimeoutArg(const std::optional<double>& seconds);

// A Buffer over memory owned by a Python object: `owner` is referenced
// until the last view of the Buffer dies, which may be on any thread (the
// release takes the GIL, and skips the decref once the interpreter is
// finalizing).
Buffer BorrowFromPython(void* data, uint64_t size, py::object owner);

// The Python-side tensor object: one xsilo Tensor (dtype, shape, Buffer).
struct PyTensor {
  Tensor tensor;
};

// Converts a Python tensor-like (xsilo.Tensor, or an object exposing a
// DLPack capsule or the buffer protocol) to a Tensor without copying.
// ValueError for a non-contiguous, non-CPU or unsupported-dtype input.
Tensor TensorFromPython(const py::handle& obj, const std::optional<std::string>& dtype);
// A Message parameter value from a Python str / int / float / bytes.
ParamValue ParamFromPython(const py::handle& value, const std::string& key);
py::object ParamToPython(const ParamValue& value);

// Owns the backend and, when metrics are on, the registry it counts into
// (a MeteredTransport wraps it) and the endpoint serving that registry.
// Destroying it stops the endpoint and the transport with the GIL released
// (transport threads may need the GIL to drop Python-borrowed tensors while
// Stop joins them), then drops the registry both read.
class PyTransport {
 public:
  explicit PyTransport(std::unique_ptr<Transport> t) : t_(std::move(t)) {}
  PyTransport(std::unique_ptr<Transport> t, std::unique_ptr<metrics::Registry> registry,
              std::unique_ptr<metrics::MetricsEndpoint> endpoint)
      : registry_(std::move(registry)), t_(std::move(t)), endpoint_(std::move(endpoint)) {}
  ~PyTransport() {
    py::gil_scoped_release release;
    endpoint_.reset();
    t_.reset();
  }
  Transport& get() { return *t_; }
  // Stops, keeping the object: another thread may still be inside receive().
  // The metrics endpoint goes on serving (a last scrape sees the final
  // counts) until the object is destroyed.
  void Stop() {
    py::gil_scoped_release release;
    t_->Stop();
  }
  // Null when metrics are off.
  const metrics::Registry* registry() const { return registry_.get(); }
  const metrics::MetricsEndpoint* endpoint() const { return endpoint_.get(); }

 private:
  std::unique_ptr<metrics::Registry> registry_;  // declared first: outlives the others
  std::unique_ptr<Transport> t_;
  std::unique_ptr<metrics::MetricsEndpoint> endpoint_;
};

// name -> tensor mapping <-> TensorMap (values as xsilo.Tensor on the way out).
TensorMap TensorsFromPython(const py::handle& mapping);
py::dict TensorsToPython(const TensorMap& tensors);

void RegisterTensors(py::module_& m);
void RegisterTransport(py::module_& m);
void RegisterStore(py::module_& m);
void RegisterFl(py::module_& m);

}  // namespace xsilo::python
