// xsilo._fastproxy: lazy-object-proxy's C proxy with a faster attribute
// read once the target is there (docs/python.md "Cost of a resolved proxy").
//
// lazy-object-proxy's getattro first looks the name up on the proxy itself
// (generic lookup), which for an attribute of the target fails with an
// AttributeError that is created and cleared, then reads it from the
// target: most of a resolved read's cost. FastProxy subclasses that type
// and, for a resolved proxy, reads a name straight from the target when
// the proxy's type does not define it (its own methods, __wrapped__,
// __class__, __reduce__ ... keep their meaning) and the proxy's own dict
// does not hold it. An unresolved proxy, and every other name, takes the
// base type's path unchanged.
//
// The base type's object layout (PyObject_HEAD, dict, wrapped, factory in
// lazy-object-proxy 1.9 to 1.12) is checked when the module loads, on a
// proxy built for the purpose; on any mismatch the module exports no
// FastProxy and xsilo.proxy keeps the base type.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

namespace {

struct LopProxy {
  PyObject_HEAD PyObject* dict;
  PyObject* wrapped;
  PyObject* factory;
};

getattrofunc g_base_getattro = nullptr;

PyObject* FastGetattro(PyObject* self, PyObject* name) {
  auto* p = reinterpret_cast<LopProxy*>(self);
  if (p->wrapped != nullptr && PyUnicode_CheckExact(name) &&
      _PyType_Lookup(Py_TYPE(self), name) == nullptr) {
    if (p->dict == nullptr) return PyObject_GetAttr(p->wrapped, name);
    PyObject* own = PyDict_GetItemWithError(p->dict, name);  // borrowed
    if (own == nullptr && !PyErr_Occurred()) return PyObject_GetAttr(p->wrapped, name);
  }
  return g_base_getattro(self, name);
}

// True when a resolved proxy of `base` holds its target and factory where
// LopProxy says.
bool LayoutMatches(PyObject* base) {
  if (reinterpret_cast<PyTypeObject*>(base)->tp_basicsize !=
      static_cast<Py_ssize_t>(sizeof(LopProxy))) {
    return false;
  }
  PyObject* builtins = PyEval_GetBuiltins();  // borrowed
  PyObject* factory = builtins ? PyDict_GetItemString(builtins, "list") : nullptr;
  if (factory == nullptr) return false;
  PyObject* proxy = PyObject_CallOneArg(base, factory);
  if (proxy == nullptr) {
    PyErr_Clear();
    return false;
  }
  PyObject* target = PyObject_GetAttrString(proxy, "__wrapped__");  // resolves: []
  bool ok = target != nullptr && reinterpret_cast<LopProxy*>(proxy)->factory == factory &&
            reinterpret_cast<LopProxy*>(proxy)->wrapped == target;
  Py_XDECREF(target);
  Py_DECREF(proxy);
  PyErr_Clear();
  return ok;
}

PyModuleDef g_module = {PyModuleDef_HEAD_INIT, "_fastproxy",
                        "lazy-object-proxy's proxy with a direct attribute read once resolved", -1,
                        nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__fastproxy(void) {
  PyObject* m = PyModule_Create(&g_module);
  if (m == nullptr) return nullptr;
  PyObject* cext = PyImport_ImportModule("lazy_object_proxy.cext");
  if (cext == nullptr) {
    PyErr_Clear();
    return m;  // no FastProxy: xsilo.proxy keeps the base type
  }
  PyObject* base = PyObject_GetAttrString(cext, "Proxy");
  Py_DECREF(cext);
  if (base == nullptr || !PyType_Check(base) || !LayoutMatches(base)) {
    Py_XDECREF(base);
    PyErr_Clear();
    return m;
  }
  g_base_getattro = reinterpret_cast<PyTypeObject*>(base)->tp_getattro;
  PyType_Slot slots[] = {{Py_tp_getattro, reinterpret_cast<void*>(&FastGetattro)}, {0, nullptr}};
  PyType_Spec spec = {"xsilo._fastproxy.FastProxy", 0, 0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
                      slots};
  PyObject* bases = PyTuple_Pack(1, base);
  Py_DECREF(base);
  PyObject* type = bases ? PyType_FromSpecWithBases(&spec, bases) : nullptr;
  Py_XDECREF(bases);
  if (type == nullptr || PyModule_AddObject(m, "FastProxy", type) != 0) {
    Py_XDECREF(type);
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
