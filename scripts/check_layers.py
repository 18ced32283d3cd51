#!/usr/bin/env python3
"""Checks that the layers' dependencies run one way.

    scripts/check_layers.py [-v]     # ctest repo.layers; -v: the graph's size
    scripts/check_layers.py --self-test   # ctest repo.layers_self_test

Reads the `#include "..."` lines of every tracked C++ file under src/,
include/xsilo/, tools/ and python/, and the `target_link_libraries` lines
of src/**/CMakeLists.txt, and fails (exit 1) on

1. an include of a higher layer: a file of layer L includes a header of a
   layer above L in LAYERS below (a header of include/xsilo/<L>/ and of
   src/<L>/ are both layer L);
2. a link of a higher layer: library xsilo_<L> links xsilo_<M> with M
   above L;
3. a public header (include/xsilo/) that includes a private one (src/):
   an installed header cannot reach it;
4. a cycle of includes between files, or between folders (a folder is a
   file's directory, with include/xsilo/<X> and src/<X> one folder); an
   include marked `// IWYU pragma: export` is a re-export, not an edge;
5. an include of another layer's private header (src/<M>/ from layer L,
   M != L) that scripts/check_layers.allow does not list. The list holds
   the reaches that predate this check, `from_file -> included_header` one
   a line; one that no longer exists is reported, so the list only
   shrinks. The headers of an interface layer (INTERFACE_LAYERS: net) are
   its interface to the layers above, not private: it installs none, and
   every layer above may include them.

Prints the rule broken with the file and line for each finding, then one
summary line per rule. Outside a git checkout it exits 77 (ctest: skipped).
--self-test runs the check on small repositories made to break each rule
and fails unless each is caught, and a clean one passes.
"""
import os
import re
import subprocess
import sys
from collections import defaultdict

# Lowest first: each layer may depend only on those before it (and itself).
LAYERS = ["core", "net", "transport", "s3", "store", "endpoint", "hybrid", "fl", "metrics", "netem",
          "bench", "tools", "python"]
RANK = {name: i for i, name in enumerate(LAYERS)}
# Layers whose src/<L>/ headers are their interface to the layers above
# (rule 5 does not apply to them; rules 1 and 3 do).
INTERFACE_LAYERS = {"net"}

# CMake libraries of each layer.
TARGETS = {
    "xsilo_core": "core",
    "xsilo_net": "net",
    "xsilo_transport": "transport",
    "xsilo_transport_grpc": "transport",
    "xsilo_grpc_internal": "transport",
    "xsilo_s3": "s3",
    "xsilo_store": "store",
    "xsilo_endpoint": "endpoint",
    "xsilo_hybrid": "hybrid",
    "xsilo_hybrid_auto": "hybrid",
    "xsilo_fl": "fl",
    "xsilo_metrics": "metrics",
    "xsilo_netem": "netem",
    "xsilo_bench": "bench",
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
SOURCE = re.compile(r"\.(h|hpp|cc|cpp|inc)$")


def layer_of(path):
    """The layer of a repository path, or None (tests, bench/, fuzz/...)."""
    parts = path.split("/")
    if parts[0] == "include" and len(parts) > 2 and parts[1] == "xsilo":
        return parts[2] if parts[2] in RANK else None
    if parts[0] == "src" and len(parts) > 1:
        return parts[1] if parts[1] in RANK else None
    if parts[0] in ("tools", "python"):
        return parts[0]
    return None


def folder_of(path):
    d = os.path.dirname(path)
    if d.startswith("include/xsilo/"):
        return "src/" + d[len("include/xsilo/"):]
    return d


def resolve(including, name, files):
    """The repository path `#include "name"` in `including` reads, or None."""
    candidates = [os.path.normpath(os.path.join(os.path.dirname(including), name))]
    candidates += ["include/" + name, "src/" + name, "python/" + name, name]
    for c in candidates:
        if c in files:
            return c
    return None


def main(root=None, verbose=False):
    root = root or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                                cwd=root, check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        print("check_layers: not a git checkout; nothing checked")
        return 77
    files = set(f for f in listed.splitlines() if os.path.isfile(os.path.join(root, f)))
    sources = sorted(f for f in files if SOURCE.search(f) and f.split("/")[0] in
                     ("src", "include", "tools", "python"))

    allow_path = os.path.join(root, "scripts", "check_layers.allow")
    allowed = set()
    if os.path.exists(allow_path):
        with open(allow_path) as f:
            for line in f:
                line = line.split("#", 1)[0].strip()
                if line:
                    allowed.add(tuple(s.strip() for s in line.split("->")))

    findings = defaultdict(list)
    edges = defaultdict(set)  # file -> files it includes
    reaches = set()
    for path in sources:
        with open(os.path.join(root, path), errors="replace") as f:
            lines = f.read().splitlines()
        src_layer = layer_of(path)
        for n, line in enumerate(lines, 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            target = resolve(path, m.group(1), files)
            if target is None:
                continue  # generated (the .pb.h files) or a system header in quotes
            # A re-export at a header's end (`// IWYU pragma: export`: proxy.h
            # brings lifetime.h, which builds on proxy.h) is its users'
            # convenience, not a dependency: it is not an edge of the cycles.
            if "IWYU pragma: export" not in line:
                edges[path].add(target)
            dst_layer = layer_of(target)
            where = f"{path}:{n}: {m.group(1)}"
            if src_layer and dst_layer and RANK[dst_layer] > RANK[src_layer]:
                findings["higher layer"].append(f"{where} ({src_layer} includes {dst_layer})")
            if path.startswith("include/") and target.startswith("src/"):
                findings["public includes private"].append(where)
            if (target.startswith("src/") and dst_layer and dst_layer != src_layer and
                    dst_layer not in INTERFACE_LAYERS and not path.startswith("include/")):
                reaches.add((path, target))
                if (path, target) not in allowed:
                    findings["private header of another layer"].append(
                        f"{where} ({src_layer or 'tests'} reaches into src/{dst_layer})")
    for a, b in sorted(allowed - reaches):
        findings["stale allow entry"].append(f"scripts/check_layers.allow: {a} -> {b}")

    # Link lines.
    for path in sorted(f for f in files if f.startswith("src/") and f.endswith("CMakeLists.txt")):
        with open(os.path.join(root, path)) as f:
            text = f.read()
        for m in re.finditer(r"target_link_libraries\(\s*(\S+)([^)]*)\)", text):
            lib = m.group(1)
            if lib not in TARGETS:
                continue
            for dep in re.findall(r"\bxsilo_\w+", m.group(2)):
                if dep in TARGETS and RANK[TARGETS[dep]] > RANK[TARGETS[lib]]:
                    line = text[:m.start()].count("\n") + 1
                    findings["higher layer"].append(
                        f"{path}:{line}: {lib} links {dep} ({TARGETS[lib]} links {TARGETS[dep]})")

    # Cycles, of files and of folders (Tarjan's strongly connected components).
    def cycles(graph):
        index, low, on, stack, out = {}, {}, set(), [], []
        counter = [0]

        def visit(v):
            index[v] = low[v] = counter[0]
            counter[0] += 1
            stack.append(v)
            on.add(v)
            for w in graph.get(v, ()):
                if w not in index:
                    visit(w)
                    low[v] = min(low[v], low[w])
                elif w in on:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))

        sys.setrecursionlimit(10000)
        for v in sorted(graph):
            if v not in index:
                visit(v)
        return out

    for comp in cycles(edges):
        findings["cycle of files"].append(" <-> ".join(comp))
    folders = defaultdict(set)
    for a, bs in edges.items():
        for b in bs:
            fa, fb = folder_of(a), folder_of(b)
            if fa != fb:
                folders[fa].add(fb)
    for comp in cycles(folders):
        findings["cycle of folders"].append(" <-> ".join(comp))

    rules = ["higher layer", "public includes private", "cycle of files", "cycle of folders",
             "private header of another layer", "stale allow entry"]
    for rule in rules:
        for f in findings[rule]:
            print(f"{rule}: {f}")
    n_edges = sum(len(v) for v in edges.values())
    print(f"check_layers: {len(sources)} files, {n_edges} includes, layers "
          + " < ".join(LAYERS))
    for rule in rules:
        print(f"  {rule}: {len(findings[rule])}")
    print(f"  private headers of another layer, listed in check_layers.allow: "
          f"{len(reaches & allowed)}")
    if verbose:
        print(f"  folders: {len(set(folder_of(s) for s in sources))}")
    return 1 if any(findings[r] for r in rules) else 0


def self_test():
    import contextlib
    import io
    import tempfile

    clean = {
        "include/xsilo/core/a.h": "",
        "src/core/a.cpp": '#include "xsilo/core/a.h"\n',
        "include/xsilo/transport/t.h": '#include "xsilo/core/a.h"\n',
        "src/transport/t.cpp": '#include "xsilo/transport/t.h"\n#include "transport/p.h"\n',
        "src/transport/p.h": "",
        "src/transport/CMakeLists.txt": "target_link_libraries(xsilo_transport PUBLIC xsilo_core)\n",
    }
    cases = [
        ("clean", {}, None),
        ("higher layer", {"src/core/b.cpp": '#include "xsilo/transport/t.h"\n'}, "higher layer"),
        ("higher link", {"src/core/CMakeLists.txt":
                         "target_link_libraries(xsilo_core PRIVATE xsilo_transport)\n"},
         "higher layer"),
        ("public includes private", {"include/xsilo/transport/u.h": '#include "transport/p.h"\n'},
         "public includes private"),
        ("file cycle", {"src/core/x.h": '#include "core/y.h"\n', "src/core/y.h": '#include "x.h"\n'},
         "cycle of files"),
        ("folder cycle", {"src/core/f/x.h": '#include "core/g/y.h"\n',
                          "src/core/g/y.h": '#include "core/f/z.h"\n', "src/core/f/z.h": ""},
         "cycle of folders"),
        ("reach", {"src/s3/s.cpp": '#include "transport/p.h"\n'},
         "private header of another layer"),
        ("stale", {"scripts/check_layers.allow": "src/s3/gone.cpp -> src/transport/p.h\n"},
         "stale allow entry"),
        ("interface layer", {"src/net/n.h": "", "src/s3/s.cpp": '#include "net/n.h"\n'}, None),
        ("interface layer from below", {"src/net/n.h": "", "src/core/c.cpp": '#include "net/n.h"\n'},
         "higher layer"),
    ]
    failed = 0
    for name, extra, rule in cases:
        with tempfile.TemporaryDirectory() as d:
            for rel, text in {**clean, **extra}.items():
                os.makedirs(os.path.join(d, os.path.dirname(rel)), exist_ok=True)
                with open(os.path.join(d, rel), "w") as f:
                    f.write(text)
            subprocess.run(["git", "init", "-q"], cwd=d, check=True)
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                rc = main(d)
            text = out.getvalue()
            ok = rc == 0 if rule is None else rc == 1 and f"\n{rule}: " in "\n" + text
            print(f"{'ok  ' if ok else 'FAIL'} {name}: exit {rc}")
            if not ok:
                failed += 1
                print(text)
    return 1 if failed else 0


if __name__ == "__main__":
    if "--self-test" in sys.argv[1:]:
        sys.exit(self_test())
    sys.exit(main(verbose="-v" in sys.argv[1:]))
