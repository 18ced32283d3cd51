#!/usr/bin/env python3
"""Checks that the paths the Markdown files cite exist.

    scripts/check_doc_paths.py [FILE.md ...]   # default: README.md, docs/, results/, bench/

Checked: relative Markdown links `[text](path)` (from the file's folder),
and inline code spans outside fenced blocks that start with a top-level
folder of the repository (`results/...`, `docs/...`, `src/...`), resolved
from the repository root. `{a,b}`, `{1..5}` and `*` are checked up to
where they start; spans with `<...>` placeholders are skipped. Fenced
blocks are commands and output and are not checked. Prints each missing
path and exits 1 if there is one.
"""
import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOP = ("results/", "docs/", "bench/", "scripts/", "src/", "include/", "tests/", "tools/",
       "examples/", "data/", "python/", "fuzz/")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\n]+)`")


def exists(path):
    for cut in ("{", "*"):
        if cut in path:
            path = path[: path.index(cut)]
            return bool(glob.glob(glob.escape(path) + "*"))
    return os.path.exists(path)


def check(md):
    missing = []
    fenced = False
    base = os.path.dirname(md)
    for n, line in enumerate(open(md, encoding="utf-8"), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        for target in LINK.findall(line):
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue
            path = target.split("#")[0]
            if path and not exists(os.path.normpath(os.path.join(base, path))):
                missing.append((n, target))
        for span in CODE.findall(line):
            for word in span.split():
                word = word.strip(".,;:()'\"")
                if not word.startswith(TOP) or "<" in word or "=" in word:
                    continue
                if not exists(os.path.join(ROOT, word)):
                    missing.append((n, word))
    return missing, fenced


def main():
    files = sys.argv[1:] or (
        [os.path.join(ROOT, "README.md")]
        + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
        + sorted(glob.glob(os.path.join(ROOT, "results", "**", "*.md"), recursive=True))
        + sorted(glob.glob(os.path.join(ROOT, "bench", "*.md"))))
    bad = 0
    for md in files:
        missing, unclosed = check(md)
        rel = os.path.relpath(md, ROOT)
        if unclosed:
            print(f"{rel}: a code fence is not closed")
            bad += 1
        for n, path in missing:
            print(f"{rel}:{n}: {path}")
            bad += 1
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
