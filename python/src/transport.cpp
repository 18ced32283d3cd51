// xsilo.Transport: any registered backend by name, with the GIL released
// during every blocking call.
#include <pybind11/stl.h>

#include <memory>

#include "common.h"
#include "xsilo/metrics/endpoint.h"
#include "xsilo/metrics/metered_transport.h"
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

// metrics_port: None or 0 = off (nullopt), "auto" = an ephemeral port (0),
// else 1..65535, as the CLI's --metrics-port (the same parser). A str is
// taken as that option's text; bool and other types are refused.
std::optional<int> MetricsPortArg(const py::handle& v) {
  if (v.is_none()) return std::nullopt;
  std::string text;
  if (py::isinstance<py::str>(v)) {
    text = v.cast<std::string>();
  } else if (py::isinstance<py::int_>(v) && !py::isinstance<py::bool_>(v)) {
    text = py::str(v);
  } else {
    throw py::value_error(
        "metrics_port must be None or 0 (off), 'auto' (an ephemeral port) or a port 1..65535, "
        "not " +
        std::string(py::repr(v)));
  }
  Result<std::optional<int>> port = metrics::ParseMetricsPort(text);
  if (!port.ok()) throw py::value_error("metrics_port: " + port.status().message());
  return *port;
}

std::unique_ptr<PyTransport> Create(const std::string& name, int32_t rank, int32_t world_size,
                                    const std::string& address, const py::object& options,
                                    double connect_timeout, size_t receive_queue_capacity,
                                    const std::optional<uint64_t>& max_message_bytes,
                                    bool metrics_on, const py::object& metrics_port,
                                    const std::string& metrics_address,
                                    const std::optional<std::string>& metrics_party) {
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
  const std::optional<int> port = MetricsPortArg(metrics_port);
  if (metrics_party && metrics_party->empty()) {
    throw py::value_error("metrics_party must not be empty (None: 'server' or 'client <rank>')");
  }

  // The registry and endpoint first: a bad metrics_address or a port in use
  // fails before any transport exists.
  std::unique_ptr<metrics::Registry> registry;
  std::unique_ptr<metrics::MetricsEndpoint> endpoint;
  if (metrics_on || port) {
    registry = std::make_unique<metrics::Registry>();
  }
  if (port) {
    Result<std::unique_ptr<metrics::MetricsEndpoint>> started =
        metrics::MetricsEndpoint::Start(*registry, {.address = metrics_address, .port = *port});
    endpoint = Check(std::move(started));
  }

  Result<std::unique_ptr<Transport>> made = TransportRegistry::Global().Create(name, o);
  // A bad option or backend name is the caller's mistake: a ValueError.
  if (!made.ok() && (made.status().code() == StatusCode::kNotFound ||
                     made.status().code() == StatusCode::kInvalidArgument)) {
    Raise(InvalidArgument(made.status().message()));
  }
  std::unique_ptr<Transport> t = Check(std::move(made));
  if (!registry) return std::make_unique<PyTransport>(std::move(t));
  // The party label as `xsilo fl run|server` gives it.
  std::string party =
      metrics_party ? *metrics_party : (rank == 0 ? "server" : "client " + std::to_string(rank));
  t = metrics::MakeMeteredTransport(std::move(t), *registry, {.party = std::move(party)});
  return std::make_unique<PyTransport>(std::move(t), std::move(registry), std::move(endpoint));
}

}  // namespace

void RegisterTransport(py::module_& m) {
  py::class_<PyTransport>(m, "Transport", R"doc(
A control-plane transport by name: "inproc", "grpc", "mpi-buffer",
"tensorpipe", or a hybrid "<transport>+<connector>" such as "grpc+s3".
options are the backend's key=value settings (docs/ per backend). Rank 0
is the server. Every blocking call takes a timeout in seconds (None: no
limit) and releases the GIL.

Metrics (docs/metrics.md): metrics=True counts what the transport moves
(xsilo_transport_* per peer and route, as `xsilo fl server`), read with
metrics_text(). metrics_port serves them as Prometheus text at
metrics_url (implies metrics=True): None or 0 off, "auto" an ephemeral
port, else the port; metrics_address is the IPv4 address it binds.
metrics_party is the `party` label (default "server" for rank 0, else
"client <rank>"). The endpoint serves until the Transport is destroyed,
after stop() too.)doc")
      .def(py::init(&Create), py::arg("name"), py::arg("rank") = 0, py::arg("world_size") = 1,
           py::arg("address") = "", py::arg("options") = py::none(),
           py::arg("connect_timeout") = 60.0, py::arg("receive_queue_capacity") = 64,
           py::arg("max_message_bytes") = py::none(), py::kw_only(), py::arg("metrics") = false,
           py::arg("metrics_port") = py::none(), py::arg("metrics_address") = "127.0.0.1",
           py::arg("metrics_party") = py::none())
      .def_property_readonly("name", [](PyTransport& t) { return std::string(t.get().name()); })
      .def_property_readonly("rank", [](PyTransport& t) { return t.get().rank(); })
      .def_property_readonly("world_size", [](PyTransport& t) { return t.get().world_size(); })
      .def_property_readonly(
          "metrics_url",
          [](PyTransport& t) -> std::optional<std::string> {
            if (t.endpoint() == nullptr) return std::nullopt;
            return t.endpoint()->url();
          },
          "http://<metrics_address>:<port>/metrics when metrics_port is set, else None.")
      .def(
          "metrics_text",
          [](PyTransport& t) -> std::optional<std::string> {
            if (t.registry() == nullptr) return std::nullopt;
            return t.registry()->Render();
          },
          "The metrics as Prometheus text (what metrics_url serves), or None when metrics "
          "are off.")
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
