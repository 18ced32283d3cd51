"""xsilo/_xsilo.pyi against the built extension, so that the stubs cannot rot.

Both ways: every name the module exports (private ones too: xsilo's own
modules use _Store, _run_server, ...) is in the stub and every name in the
stub exists; for every class its bases, its methods (with the dunders the
bindings define), its properties and whether they can be set; for every
function and method its parameter list (names, positional-only,
keyword-only, which have defaults). The stub is parsed with ast; no type
checker is needed.
"""

import ast
import inspect
import os
import types

import pytest

import xsilo
import xsilo._xsilo as ext

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("XSILO_SOURCE_DIR", os.path.dirname(os.path.dirname(HERE)))
PACKAGE = os.path.dirname(xsilo.__file__)
STUB = os.path.join(PACKAGE, "_xsilo.pyi")
# In a class's __dict__ but not API.
NOT_API = {"__module__", "__doc__", "__weakref__", "__dict__"}


def stub_tree():
    with open(STUB) as f:
        return ast.parse(f.read(), STUB)


def is_dunder(name):
    return name.startswith("__") and name.endswith("__")


def split_top_level(text):
    """Splits a parameter list at the commas outside brackets and quotes."""
    parts, depth, quote, cur = [], 0, None, ""
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
            continue
        cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


def runtime_params(name, obj):
    """[(kind, name or None, has_default)] of a runtime callable. For pybind11
    functions, from the signature line of the docstring; unnamed arguments
    (arg0, arg1, ...) are positional-only, their name None."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        sig = None
    if sig is not None:
        kinds = {inspect.Parameter.POSITIONAL_ONLY: "posonly",
                 inspect.Parameter.POSITIONAL_OR_KEYWORD: "pos",
                 inspect.Parameter.VAR_POSITIONAL: "varargs",
                 inspect.Parameter.KEYWORD_ONLY: "kwonly",
                 inspect.Parameter.VAR_KEYWORD: "varkw"}
        return [(kinds[p.kind], None if p.kind == p.POSITIONAL_ONLY else p.name,
                 p.default is not p.empty) for p in sig.parameters.values()]
    doc = (obj.__doc__ or "").lstrip()
    assert doc.startswith(name + "("), (
        f"{name}: no pybind11 signature line in its docstring (an overload? teach this test): "
        f"{doc[:80]!r}")
    depth, end = 0, None
    for i, ch in enumerate(doc):
        depth += ch == "("
        depth -= ch == ")"
        if ch == ")" and depth == 0:
            end = i
            break
    out, kwonly = [], False
    for p in split_top_level(doc[len(name) + 1:end]):
        pname = p.split(":")[0].split("=")[0].strip()
        if pname == "*":
            kwonly = True
        elif pname.startswith("**"):
            out.append(("varkw", pname[2:], False))
        elif pname.startswith("*"):
            out.append(("varargs", pname[1:], False))
            kwonly = True
        elif pname.startswith("arg") and pname[3:].isdigit():
            out.append(("posonly", None, False))
        else:
            has_default = "=" in p.split(":", 1)[-1] if ":" in p else "=" in p
            out.append(("kwonly" if kwonly else "pos", pname, has_default))
    return out


def stub_params(fn):
    a = fn.args
    out = [("posonly", x.arg, False) for x in a.posonlyargs]
    out += [("pos", x.arg, False) for x in a.args]
    positional = len(out)
    for i in range(len(a.defaults)):  # defaults align with the last positional parameters
        k, n, _ = out[positional - len(a.defaults) + i]
        out[positional - len(a.defaults) + i] = (k, n, True)
    if a.vararg:
        out.append(("varargs", a.vararg.arg, False))
    for x, d in zip(a.kwonlyargs, a.kw_defaults):
        out.append(("kwonly", x.arg, d is not None))
    if a.kwarg:
        out.append(("varkw", a.kwarg.arg, False))
    return out


def same_params(stub, runtime, method):
    """stub_params against runtime_params; a method's first parameter (self,
    positional-only or not in the stub) is left out, and so are the names of
    the runtime's unnamed (positional-only) arguments. (Tensor.torch, from
    xsilo/__init__.py, calls its instance t.)"""
    if method:
        assert stub and stub[0][1] == "self", "a method's first parameter is self"
        assert runtime and runtime[0][0] in ("pos", "posonly")  # the instance, by any name
        stub, runtime = stub[1:], runtime[1:]
    if len(stub) != len(runtime):
        return False
    for (sk, sn, sd), (rk, rn, rd) in zip(stub, runtime):
        if sk != rk or sd != rd or (rn is not None and sn != rn):
            return False
    return True


def decorators(fn):
    out = set()
    for d in fn.decorator_list:
        if isinstance(d, ast.Name):
            out.add(d.id)
        elif isinstance(d, ast.Attribute):
            out.add(d.attr)  # @x.setter -> "setter"
    return out


def base_name(node):
    return node.id if isinstance(node, ast.Name) else node.attr


class StubClass:
    def __init__(self, node):
        self.node = node
        self.methods, self.properties, self.setters, self.attributes = {}, set(), set(), set()
        self.static = set()
        for item in node.body:
            if isinstance(item, ast.FunctionDef):
                ds = decorators(item)
                if "property" in ds:
                    self.properties.add(item.name)
                elif "setter" in ds:
                    self.setters.add(item.name)
                else:
                    self.methods[item.name] = item
                    if "staticmethod" in ds:
                        self.static.add(item.name)
            elif isinstance(item, ast.AnnAssign):
                self.attributes.add(item.target.id)


def stub_module():
    classes, functions, variables = {}, {}, set()
    for node in stub_tree().body:
        if isinstance(node, ast.ClassDef):
            classes[node.name] = StubClass(node)
        elif isinstance(node, ast.FunctionDef):
            functions[node.name] = node
        elif isinstance(node, ast.AnnAssign):
            variables.add(node.target.id)
        elif isinstance(node, ast.Assign):  # private type aliases only
            for t in node.targets:
                assert t.id.startswith("_"), f"stub assigns a public name {t.id}"
    return classes, functions, variables


RUNTIME = sorted(n for n in dir(ext) if not is_dunder(n)) + ["__version__"]
CLASSES = [n for n in RUNTIME if inspect.isclass(getattr(ext, n))]


def test_the_stub_is_the_source_file_and_the_package_is_typed():
    with open(os.path.join(SOURCE, "python", "xsilo", "_xsilo.pyi")) as f:
        source = f.read()
    with open(STUB) as f:
        assert f.read() == source, "the build tree's _xsilo.pyi is stale: re-run cmake"
    assert os.path.exists(os.path.join(PACKAGE, "py.typed"))


def test_every_exported_name_is_in_the_stub_and_nothing_else():
    classes, functions, variables = stub_module()
    in_stub = set(classes) | set(functions) | variables
    missing = sorted(set(RUNTIME) - in_stub)
    assert not missing, f"_xsilo exports names the stub lacks: {missing}"
    extra = sorted(in_stub - set(RUNTIME))
    assert not extra, f"the stub declares names _xsilo does not export: {extra}"
    for n in functions:
        assert callable(getattr(ext, n)) and not inspect.isclass(getattr(ext, n)), n
    for n in classes:
        assert inspect.isclass(getattr(ext, n)), n


@pytest.mark.parametrize("name", CLASSES)
def test_every_class_matches_its_stub(name):
    cls = getattr(ext, name)
    stub = stub_module()[0][name]
    bases = [b.__name__ for b in cls.__bases__ if b.__name__ != "pybind11_object"]
    assert [base_name(b) for b in stub.node.bases] == bases, f"{name}: bases"

    members = {k: v for k, v in vars(cls).items() if k not in NOT_API}
    props = {k for k, v in members.items() if isinstance(v, property)}
    settable = {k for k in props if members[k].fset is not None}
    methods = set(members) - props
    if issubclass(cls, BaseException):
        # .code and .message are set on each raised instance (python/src/module.cpp).
        assert not props and not stub.properties
        with pytest.raises(xsilo.Error) as e:
            xsilo.Transport("no-such-backend")
        assert all(hasattr(e.value, a) for a in stub.attributes), f"{name}: attributes"
        if name == "Error":
            assert stub.attributes == {"code", "message"}
    else:
        # A settable property is a property with a setter, or a plain attribute.
        assert stub.properties | stub.attributes == props, f"{name}: properties"
        assert not (stub.attributes & stub.properties)
        assert {p for p in props if p in stub.attributes or p in stub.setters} == settable, \
            f"{name}: which properties can be set"
    assert set(stub.methods) == methods, (
        f"{name}: methods missing from the stub {sorted(methods - set(stub.methods))}, "
        f"in the stub only {sorted(set(stub.methods) - methods)}")
    for m in methods:
        assert (m in stub.static) == isinstance(members[m], staticmethod), f"{name}.{m}: static"
        got = runtime_params(m, getattr(cls, m))
        want = stub_params(stub.methods[m])
        assert same_params(want, got, m not in stub.static), \
            f"{name}.{m}: parameters: stub {want}, module {got}"


def test_every_function_matches_its_stub():
    functions = stub_module()[1]
    for n, fn in functions.items():
        want, got = stub_params(fn), runtime_params(n, getattr(ext, n))
        assert same_params(want, got, False), f"{n}: parameters: stub {want}, module {got}"


def test_the_checker_sees_a_wrong_parameter_list():
    """The comparison fails on what it is meant to catch."""
    def pybind(doc):  # what a pybind11 function offers: a docstring, no signature
        return types.SimpleNamespace(__doc__=doc)

    runtime = runtime_params(
        "f", pybind("f(self: T, a: int, b: int = 1, *, c: object = None) -> None"))
    assert runtime == [("pos", "self", False), ("pos", "a", False), ("pos", "b", True),
                       ("kwonly", "c", True)]

    def stub(text):
        return stub_params(ast.parse(text).body[0])

    assert same_params(stub("def f(self, a, b=1, *, c=None): ..."), runtime, True)
    assert not same_params(stub("def f(self, a, b, *, c=None): ..."), runtime, True)
    assert not same_params(stub("def f(self, a, b=1, c=None): ..."), runtime, True)
    assert not same_params(stub("def f(self, x, b=1, *, c=None): ..."), runtime, True)
    assert not same_params(stub("def f(self, a, b=1): ..."), runtime, True)
    unnamed = runtime_params("g", pybind("g(self: T, arg0: str) -> None"))
    assert same_params(stub("def g(self, key: str, /): ..."), unnamed, True)
    assert not same_params(stub("def g(self, key: str): ..."), unnamed, True)
