// xsilo.Transport: any registered backend by name, with the GIL released
// during every blocking call.
#include <pybind11/stl.h>

#include <memory>

#include "common.h"
#include "xsilo/transport/registry.h"

namespace xsilo::python {

namespace {

// Start with the GIL released (it may wait connect_timeout for peers).
void Start(PyTransport& t) {
  Transport& tr = t.get();
  Status s;
  {
    py::gil_scoped_release release;
    s = tr.Start();
  }
  Check(s);
}

std::string OptionText(const py::handle& v, const std::string& key) {
  if (py::isinstance<py::str>(v)) return v.cast<std::string>();
  if (py::isinstance<py::bool_>(v)) return v.cast<bool>() ? "1" : "0";
  if (py::isinstance<py::int_>(v) || py::isinstance<py::float_>(v)) return py::str(v);
  throw py::value_error("option '" + key + "' must be str, int, float or bool, not " +
                        std::string(Py_TYPE(v.ptr())->tp_name));
}

std::unique_ptr<PyTransport> Create(const std::string& name, int32_t rank, int32_t world_size,
                                    const std::string& address, const py::object& options,
                                    double connect_timeout, size_t receive_queue_capacity,
                                    const std::optional<uint64_t>& max_message_bytes) {
  TransportOptions o;
  o.rank = rank;
  o.world_size = world_size;
  o.address = address;
  o.connect_timeout = TimeoutArg(connect_timeout);
  o.receive_queue_capacity = receive_queue_capacity;
  if (max_message_bytes) o.max_message_bytes = *max_message_bytes;
  if (world_size < 1) throw py::value_error("world_size must be >= 1");
  if (rank < 0 || rank >= world_size) {
    throw py::value_error("rank " + std::to_string(rank) +
                          " is outside [0, world_size=" + std::to_string(world_size) + ")");
  }
  if (!options.is_none()) {
    for (auto item : options.cast<py::dict>()) {
      std::string key = py::str(item.first);
      o.backend[key] = OptionText(item.second, key);
    }
  }
  Result<std::unique_ptr<Transport>> made = TransportRegistry::Global().Create(name, o);
  // A bad option or backend name is the caller's mistake: a ValueError.
  if (!made.ok() && (made.status().code() == StatusCode::kNotFound ||
                     made.status().code() == StatusCode::kInvalidArgument)) {
    Raise(InvalidArgument(made.status().message()));
  }
  return std::make_unique<PyTransport>(Check(std::move(made)));
}

}  // namespace

void RegisterTransport(py::module_& m) {
  py::class_<PyTransport>(m, "Transport", R"doc(
A control-plane transport by name: "inproc", "grpc", "mpi-buffer",
"tensorpipe", or a hybrid "<transport>+<connector>" such as "grpc+s3".
options are the backend's key=value settings (docs/ per backend). Rank 0
is the server. Every blocking call takes a timeout in seconds (None: no
limit) and releases the GIL.)doc")
      .def(py::init(&Create), py::arg("name"), py::arg("rank") = 0, py::arg("world_size") = 1,
           py::arg("address") = "", py::arg("options") = py::none(),
           py::arg("connect_timeout") = 60.0, py::arg("receive_queue_capacity") = 64,
           py::arg("max_message_bytes") = py::none())
      .def_property_readonly("name", [](PyTransport& t) { return std::string(t.get().name()); })
      .def_property_readonly("rank", [](PyTransport& t) { return t.get().rank(); })
      .def_property_readonly("world_size", [](PyTransport& t) { return t.get().world_size(); })
      .def(
          "start", [](PyTransport& t) { Start(t); },
          "Connects (clients) or listens (the server); waits at most connect_timeout.")
      .def(
          "stop", [](PyTransport& t) { t.Stop(); },
          "Stops the transport: pending sends fail, receivers wake. Idempotent.")
      .def(
          "send",
          [](PyTransport& t, int32_t peer, const Message& msg, std::optional<double> timeout) {
            Transport& tr = t.get();
            Duration d = TimeoutArg(timeout);
            Message copy = msg;  // shares the tensor Buffers
            Status s;
            {
              py::gil_scoped_release release;
              s = tr.Send(peer, std::move(copy), d);
            }
            Check(s);
          },
          py::arg("peer"), py::arg("message"), py::arg("timeout") = py::none(),
          "Sends to one peer and waits until the transport handed it over.")
      .def(
          "broadcast",
          [](PyTransport& t, std::vector<int32_t> peers, const Message& msg,
             std::optional<double> timeout) {
            Transport& tr = t.get();
            Duration d = TimeoutArg(timeout);
            Message copy = msg;
            Status s;
            {
              py::gil_scoped_release release;
              s = tr.Broadcast(std::move(peers), std::move(copy), d);
            }
            Check(s);
          },
          py::arg("peers"), py::arg("message"), py::arg("timeout") = py::none(),
          "Sends one message to many peers, sharing its payload (never copied per peer).")
      .def(
          "receive",
          [](PyTransport& t, std::optional<double> timeout) {
            Transport& tr = t.get();
            Duration d = TimeoutArg(timeout);
            Result<Message> got = Cancelled("");
            {
              py::gil_scoped_release release;
              got = tr.Receive(d);
            }
            return Check(std::move(got));
          },
          py::arg("timeout") = py::none(),
          "The next received message (TimeoutError when none arrives in time).")
      .def(
          "__enter__",
          [](PyTransport& t) -> PyTransport& {
            Start(t);
            return t;
          },
          py::return_value_policy::reference)
      .def("__exit__", [](PyTransport& t, const py::args&) { t.Stop(); });

  m.def(
      "transports",
      [] {
        py::dict out;
        auto& registry = TransportRegistry::Global();
        for (const std::string& name : registry.Names()) {
          Status viable = registry.Viable(name);
          out[py::str(name)] = viable.ok() ? py::object(py::none()) : py::str(viable.message());
        }
        return out;
      },
      "Every backend name -> None when usable in this process, else why not.");
}

}  // namespace xsilo::python
