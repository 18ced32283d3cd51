// The data plane for Python: Store over any connector, and proxy
// references that another process resolves from the reference alone.
// Objects are raw bytes, tensor dicts (a safetensors object) or Messages;
// the Python package (xsilo/store.py) picks the kind and wraps proxies.
#include <pybind11/stl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common.h"
#include "xsilo/store/proxy.h"
#include "xsilo/store/store.h"

namespace xsilo::python {

namespace {

class PyStore {
 public:
  explicit PyStore(std::shared_ptr<Store> s) : s_(std::move(s)) {}
  ~PyStore() {
    py::gil_scoped_release release;
    s_.reset();
  }
  Store& get() { return *s_; }
  const std::shared_ptr<Store>& shared() { return s_; }

 private:
  std::shared_ptr<Store> s_;
};

// Runs `f` with the GIL released and raises its error.
template <typename F>
auto Unlocked(F&& f) {
  auto out = [&] {
    py::gil_scoped_release release;
    return f();
  }();
  if constexpr (std::is_same_v<decltype(out), Status>) {
    Check(out);
  } else {
    return Check(std::move(out));
  }
}

Key KeyArg(const std::string& json) {
  auto key = Key::FromJson(json);
  if (!key.ok()) throw py::value_error("not an xsilo key: " + key.status().message());
  return *key;
}

py::object BytesOut(const std::optional<Buffer>& b) {
  if (!b) return py::none();
  Tensor t;
  t.dtype = DType::kU8;
  t.shape = {static_cast<int64_t>(b->size())};
  t.data = *b;
  return py::cast(PyTensor{t});
}

py::object TensorsOut(const std::optional<TensorMap>& m) {
  return m ? py::object(TensorsToPython(*m)) : py::object(py::none());
}

Buffer BytesIn(const py::object& obj) { return TensorFromPython(obj, std::string("U8")).data; }

template <typename T>
std::string ProxyOf(PyStore& s, const T& object, bool evict_on_resolve) {
  ProxyOptions options;
  options.evict_on_resolve = evict_on_resolve;
  Store& store = s.get();
  Proxy<T> proxy = Unlocked([&] { return store.MakeProxy(object, options); });
  return Check(proxy.Serialize());
}

template <typename T>
T ResolveReference(const std::string& reference) {
  auto proxy = Proxy<T>::Deserialize(reference);
  if (!proxy.ok()) throw py::value_error("not a proxy reference: " + proxy.status().message());
  return Unlocked([&]() -> Result<T> {
    XSILO_ASSIGN_OR_RETURN(const T* target, proxy->Get());
    return *target;
  });
}

// Bytes objects of this size and more have their interior advised for
// transparent huge pages before they are filled. A fresh bytes object
// comes from malloc, whose pages the kernel faults in 4 KiB at a time on
// first write; on the development VM that cost ~15 us a page, 400 ms for
// 100 MB, against ~20 ms in huge pages (docs/python.md). The engine's own
// Buffers do the same (src/core/buffer.cpp).
constexpr uint64_t kHugeAdvice = 8ull << 20;
constexpr uintptr_t kHugePage = 2ull << 20;

py::bytes NewBytes(uint64_t n) {
  if (n > static_cast<uint64_t>(PY_SSIZE_T_MAX)) throw py::value_error("object too large");
  PyObject* b = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(n));
  if (b == nullptr) throw py::error_already_set();
  if (n >= kHugeAdvice) {
    auto p = reinterpret_cast<uintptr_t>(PyBytes_AS_STRING(b));
    uintptr_t lo = (p + kHugePage - 1) & ~(kHugePage - 1);
    uintptr_t hi = (p + n) & ~(kHugePage - 1);
    if (hi > lo) (void)madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE);  // a hint
  }
  return py::reinterpret_steal<py::bytes>(b);
}

py::dict OpDict(const OpMetrics& op) {
  py::dict d;
  d["count"] = op.count;
  d["total_ns"] = op.total_ns;
  d["max_ns"] = op.max_ns;
  d["total_bytes"] = op.total_bytes;
  return d;
}

}  // namespace

void RegisterStore(py::module_& m) {
  py::class_<PyStore>(m, "_Store")
      .def(py::init([](const std::string& name, const std::string& connector,
                       const std::map<std::string, std::string>& options, uint64_t cache_bytes,
                       bool register_store) {
             ConnectorConfig config{connector, options};
             auto made = MakeConnector(config);
             if (!made.ok() && (made.status().code() == StatusCode::kNotFound ||
                                made.status().code() == StatusCode::kInvalidArgument)) {
               Raise(InvalidArgument(made.status().message()));
             }
             StoreOptions so;
             so.cache_bytes = cache_bytes;
             auto store = Check(Store::Create(name, Check(std::move(made)), so));
             if (register_store) Check(StoreRegistry::Global().Register(store));
             return std::make_unique<PyStore>(std::move(store));
           }),
           py::arg("name"), py::arg("connector"), py::arg("options"), py::arg("cache_bytes"),
           py::arg("register"))
      .def_static("from_config",
                  [](const std::string& json) {
                    auto config = StoreConfig::FromJson(json);
                    if (!config.ok()) {
                      throw py::value_error("not a store config: " + config.status().message());
                    }
                    auto store =
                        Unlocked([&] { return StoreRegistry::Global().GetOrCreate(*config); });
                    return std::make_unique<PyStore>(std::move(store));
                  })
      .def_property_readonly("name", [](PyStore& s) { return s.get().name(); })
      .def("config", [](PyStore& s) { return s.get().config().ToJson(); })
      .def("put_bytes",
           [](PyStore& s, const py::object& obj) {
             Buffer b = BytesIn(obj);
             return Unlocked([&] { return s.get().Put(b); }).ToJson();
           })
      .def("put_tensors",
           [](PyStore& s, const py::dict& tensors) {
             TensorMap t = TensorsFromPython(tensors);
             return Unlocked([&] { return s.get().Put(t); }).ToJson();
           })
      .def("put_message",
           [](PyStore& s, const Message& msg) {
             return Unlocked([&] { return s.get().Put(msg); }).ToJson();
           })
      .def("get_bytes",
           [](PyStore& s, const std::string& key) {
             Key k = KeyArg(key);
             return BytesOut(Unlocked([&] { return s.get().Get<Buffer>(k); }));
           })
      .def("get_tensors",
           [](PyStore& s, const std::string& key) {
             Key k = KeyArg(key);
             return TensorsOut(Unlocked([&] { return s.get().Get<TensorMap>(k); }));
           })
      .def("get_message",
           [](PyStore& s, const std::string& key) -> py::object {
             Key k = KeyArg(key);
             auto got = Unlocked([&] { return s.get().Get<Message>(k); });
             if (!got) return py::none();
             return py::cast(std::move(*got));
           })
      .def("exists",
           [](PyStore& s, const std::string& key) {
             Key k = KeyArg(key);
             return Unlocked([&] { return s.get().Exists(k); });
           })
      .def("evict",
           [](PyStore& s, const std::string& key) {
             Key k = KeyArg(key);
             Unlocked([&] { return s.get().Evict(k); });
           })
      .def("new_key",
           [](PyStore& s) { return Unlocked([&] { return s.get().NewKey(); }).ToJson(); })
      .def("set_bytes",
           [](PyStore& s, const std::string& key, const py::object& obj) {
             Key k = KeyArg(key);
             Buffer b = BytesIn(obj);
             Unlocked([&] { return s.get().Set(k, b); });
           })
      .def("set_tensors",
           [](PyStore& s, const std::string& key, const py::dict& tensors) {
             Key k = KeyArg(key);
             TensorMap t = TensorsFromPython(tensors);
             Unlocked([&] { return s.get().Set(k, t); });
           })
      // True once the key exists, False when timeout_ms passed first; waits
      // by notification where the connector has one (redis), else polls.
      .def("wait",
           [](PyStore& s, const std::string& key, int64_t timeout_ms) {
             Key k = KeyArg(key);
             Status st = [&] {
               py::gil_scoped_release release;
               return s.get().WaitForKey(
                   k, std::chrono::milliseconds(std::max<int64_t>(0, timeout_ms)));
             }();
             if (st.code() == StatusCode::kTimeout) return false;
             Check(st);
             return true;
           })
      .def("proxy_bytes", [](PyStore& s, const py::object& obj,
                             bool evict) { return ProxyOf(s, BytesIn(obj), evict); })
      .def("proxy_tensors",
           [](PyStore& s, const py::dict& tensors, bool evict) {
             return ProxyOf(s, TensorsFromPython(tensors), evict);
           })
      .def("proxy_message",
           [](PyStore& s, const Message& msg, bool evict) { return ProxyOf(s, msg, evict); })
      .def("metrics",
           [](PyStore& s) {
             StoreMetrics x = s.get().metrics();
             py::dict d;
             d["put"] = OpDict(x.put);
             d["get"] = OpDict(x.get);
             d["resolve"] = OpDict(x.resolve);
             d["cache_hits"] = x.cache_hits;
             d["cache_misses"] = x.cache_misses;
             return d;
           })
      .def("close", [](PyStore& s) {
        Store& store = s.get();
        StoreRegistry::Global().Unregister(store.name());
        py::gil_scoped_release release;
        store.Close();
      });

  m.def(
      "_bytes_from",
      [](const py::buffer& src) {
        py::buffer_info info = src.request();
        if (info.ndim > 1 && info.strides.back() != info.itemsize) {
          throw py::value_error("_bytes_from needs a contiguous buffer");
        }
        auto n = static_cast<uint64_t>(info.size * info.itemsize);
        py::bytes out = NewBytes(n);
        char* dst = PyBytes_AS_STRING(out.ptr());
        {
          py::gil_scoped_release release;
          std::memcpy(dst, info.ptr, n);
        }
        return out;
      },
      "A bytes copy of a contiguous buffer, in huge pages when large.");
  m.def(
      "_pread_bytes",
      [](int fd, uint64_t n, uint64_t offset) {
        py::bytes out = NewBytes(n);
        char* dst = PyBytes_AS_STRING(out.ptr());
        uint64_t done = 0;
        int err = 0;
        {
          py::gil_scoped_release release;
          while (done < n) {
            ssize_t r = ::pread(fd, dst + done, std::min<uint64_t>(n - done, 1 << 30),
                                static_cast<off_t>(offset + done));
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) err = errno;
            if (r <= 0) break;
            done += static_cast<uint64_t>(r);
          }
        }
        if (err != 0) {
          errno = err;
          PyErr_SetFromErrno(PyExc_OSError);
          throw py::error_already_set();
        }
        if (done != n) {
          throw py::value_error("file ends after " + std::to_string(done) + " of " +
                                std::to_string(n) + " bytes");
        }
        return out;
      },
      "n bytes of fd from offset as one bytes object (huge pages when large).");
  m.def("_resolve_bytes",
        [](const std::string& ref) { return BytesOut(ResolveReference<Buffer>(ref)); });
  m.def("_resolve_tensors",
        [](const std::string& ref) { return TensorsOut(ResolveReference<TensorMap>(ref)); });
  m.def("_resolve_message", [](const std::string& ref) { return ResolveReference<Message>(ref); });
}

}  // namespace xsilo::python
