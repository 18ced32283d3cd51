#!/usr/bin/env python3
"""Checks that every repository path the code and the docs name exists.

    scripts/check_paths.py [-v]      # ctest repo.paths; -v: how many were checked

Scans the tracked files (`git ls-files`) of src/, include/, tools/, tests/,
bench/, python/, scripts/, fuzz/, examples/, cmake/, docs/, README.md,
results/README.md, CMakeLists.txt and Makefile (C++ comments and strings,
Markdown text, inline code and fenced blocks alike) for tokens that start
with a top-level folder of the repository,

    (src|include|tools|tests|docs|results|scripts|bench|python|fuzz|examples|data|cmake)/...

and, in Markdown, for relative links `[text](path)` (from the file's
folder) and code fences left open. Prints `file:line: path` for each path that is neither a file nor
a folder of the repository (tracked, or new and not ignored) and exits 1
if there is one; outside a git checkout it exits 77 (ctest: skipped).

A token may start with `../` (from its file's folder), `${PROJECT_SOURCE_DIR}/`
or `${CMAKE_SOURCE_DIR}/` (from the root) or `${CMAKE_CURRENT_SOURCE_DIR}/`
(from its file's folder); one that is part of a longer path
(`build/bench/soak`, `/tmp/results/x`, `${CMAKE_BINARY_DIR}/python`) is not
checked. Trailing punctuation and `:123` line suffixes are not part of the
path. A path may also be relative to its file's folder (a CMakeLists.txt's
sources), and a program may be named by its source without the extension
(`bench/soak` for bench/soak.cpp).

Not checked:
- patterns and placeholders: a token with `...` in it, or followed by `*`,
  `<`, `{`, `$`, `%` or `#`, or ending in `-` or `_` (a prefix:
  `"results/p2p-" + UtcStamp()`);
- paths in git history: a token right after `<commit>:` (7-40 hex digits,
  or `<hash>`), as in `git show 8cbfe84:results/archive/HISTORY.md`, and
  a git command's pathspec (after ` -- `: `git checkout 8cbfe84 -- results/x`);
- what a command writes: a token right after `--out `, `--out=` or `-o `,
  and in the same file that path and what is under it (`xsilo bench plot
  --in` the folder the command above it wrote);
- paths git ignores (`results/tmp/`, build trees);
- `#include` lines (the compiler checks those);
- each `file:path` listed in scripts/check_paths.allow (one a line, `#`
  starts a comment).
"""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCANNED_DIRS = ("src/", "include/", "tools/", "tests/", "bench/", "python/", "scripts/",
                "fuzz/", "examples/", "cmake/", "docs/")
SCANNED_FILES = ("README.md", "results/README.md", "CMakeLists.txt", "Makefile")
TOP = "src|include|tools|tests|docs|results|scripts|bench|python|fuzz|examples|data|cmake"
TOKEN = re.compile(r"(?<![A-Za-z0-9_.\-])((?:\.\./)*)((?:%s)/[A-Za-z0-9_./+\-]*)" % TOP)
# What may come right before a token that is part of something else.
REVISION = re.compile(r"(?:\b[0-9a-f]{7,40}|<[^>\s]*>):$")
OUTPUT = re.compile(r"(?:--out[ =]|-o )$")
GIT_PATHSPEC = re.compile(r"\bgit [a-z-]+ [^`]*?-- (?:\S+ )*$")
PLACEHOLDER_AFTER = set("*<{$%#")
CMAKE_VAR = re.compile(r"\$\{(\w+)\}/$")
ROOT_VARS = ("PROJECT_SOURCE_DIR", "CMAKE_SOURCE_DIR", "XSILO_SOURCE_DIR")
PROGRAM_EXT = (".cpp", ".cc", ".c", ".py", ".sh")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
SKIP_EXT = (".png", ".jpg", ".gz", ".zst", ".bin", ".pdf", ".ico")


def git(*args, stdin=None):
    return subprocess.run(["git", "-C", ROOT] + list(args), input=stdin, check=True,
                          capture_output=True, text=True).stdout


def repo_paths():
    """Every file of the repository (tracked, or new and not ignored) and
    every folder that holds one."""
    files = set(git("ls-files", "-z").split("\0"))
    files |= set(git("ls-files", "-z", "--others", "--exclude-standard").split("\0"))
    files.discard("")
    dirs = set()
    for f in files:
        d = os.path.dirname(f)
        while d and d not in dirs:
            dirs.add(d)
            d = os.path.dirname(d)
    return files, dirs


ALLOW = "scripts/check_paths.allow"


def scanned(files):
    return sorted(f for f in files
                  if (f.startswith(SCANNED_DIRS) or f in SCANNED_FILES) and f != ALLOW
                  and not f.endswith(SKIP_EXT) and os.path.isfile(os.path.join(ROOT, f)))


def load_allow():
    allow = set()
    path = os.path.join(ROOT, ALLOW)
    if os.path.exists(path):
        for line in open(path, encoding="utf-8"):
            line = line.split("#", 1)[0].strip()
            if line:
                allow.add(line)
    return allow


def candidates(rel, text, outputs):
    """(line, path as written, paths it may be from the root) of each token
    to check; adds what commands write (`--out`) to outputs."""
    base = os.path.dirname(rel)
    for n, line in enumerate(text.split("\n"), 1):
        if line.lstrip().startswith("#include"):
            continue
        if rel.endswith(".md"):
            for target in LINK.findall(line):
                target = target.split("#")[0]
                if not target or re.match(r"^[a-z]+:", target) or "<" in target:
                    continue
                full = os.path.normpath(os.path.join(base, target))
                if not full.startswith(".."):
                    yield n, target, [full]
        for m in TOKEN.finditer(line):
            up, path = m.group(1), m.group(2)
            start, end = m.start(), m.end()
            before = line[:start]
            var = None
            if before.endswith("/") and not up:
                var = CMAKE_VAR.search(before)
                if not var or var.group(1) not in ROOT_VARS + ("CMAKE_CURRENT_SOURCE_DIR",):
                    continue  # part of a longer path: build/bench/..., /tmp/results/...
            if REVISION.search(before) or GIT_PATHSPEC.search(before):
                continue
            if OUTPUT.search(before):
                outputs.add(path.rstrip(".,;:/"))
                continue
            if end < len(line) and line[end] in PLACEHOLDER_AFTER:
                continue
            if "..." in path:
                continue
            path = path.rstrip(".,;:")
            if path.endswith(("-", "_")):
                continue
            path = path.rstrip("/")
            if up:
                full = [os.path.normpath(os.path.join(base, up + path))]
                if full[0].startswith(".."):
                    continue  # outside the repository
            elif var and var.group(1) not in ROOT_VARS:
                full = [os.path.normpath(os.path.join(base, path))]
            else:
                full = [path, os.path.normpath(os.path.join(base, path))]
            yield n, up + path, full


def main():
    verbose = "-v" in sys.argv[1:]
    try:
        files, dirs = repo_paths()
    except (OSError, subprocess.CalledProcessError):
        print("not a git checkout: nothing to check", file=sys.stderr)
        return 77  # ctest: skipped (SKIP_RETURN_CODE)
    allow = load_allow()
    missing = []
    checked = 0
    tracked = [f for f in git("ls-files", "-z").split("\0") if f]

    def exists(path, outputs):
        return (path in files or path in dirs
                or any(path + ext in files for ext in PROGRAM_EXT)
                or any(path == o or path.startswith(o + "/") for o in outputs))

    for rel in scanned(tracked):
        try:
            text = open(os.path.join(ROOT, rel), encoding="utf-8").read()
        except UnicodeDecodeError:
            continue
        if rel.endswith(".md") and sum(
                1 for l in text.split("\n") if l.lstrip().startswith("```")) % 2:
            missing.append((rel, 0, "(a code fence is not closed)", ""))
        outputs = set()
        found = list(candidates(rel, text, outputs))
        for n, written, full in found:
            checked += 1
            if any(exists(p, outputs) for p in full):
                continue
            if f"{rel}:{written}" in allow:
                continue
            missing.append((rel, n, written, full[0]))
    if missing:
        # Paths git ignores (results/tmp/, build trees) are not the repository's.
        ignored = set(subprocess.run(
            ["git", "-C", ROOT, "check-ignore", "--no-index", "--stdin"],
            input="\n".join(p for m in missing if m[3] for p in (m[3], m[3] + "/")),
            capture_output=True, text=True).stdout.split("\n"))
        missing = [m for m in missing
                   if not m[3] or (m[3] not in ignored and m[3] + "/" not in ignored)]
    for rel, n, written, _ in missing:
        print(f"{rel}:{n}: {written}")
    if verbose:
        print(f"{checked} paths checked, {len(missing)} missing", file=sys.stderr)
    if missing:
        print(f"{len(missing)} path(s) above do not exist in the repository "
              "(fix the reference, or list `file:path` in scripts/check_paths.allow)",
              file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
