"""python/pyproject.toml: the build tree CMake lays out is a package pip
installs as it is (docs/python.md, "Packaging"). Offline: pip runs with
--no-index --no-build-isolation and the system's setuptools."""

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tomllib

import pytest

import xsilo

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("XSILO_SOURCE_DIR", os.path.dirname(os.path.dirname(HERE)))
TREE = os.path.dirname(os.path.dirname(xsilo.__file__))  # <build>/python


def read_toml(path):
    with open(path, "rb") as f:
        return tomllib.load(f)


def test_the_version_is_the_projects():
    project = read_toml(os.path.join(SOURCE, "python", "pyproject.toml"))["project"]
    with open(os.path.join(SOURCE, "CMakeLists.txt")) as f:
        cmake = re.search(r"project\(xsilo VERSION ([0-9.]+)", f.read()).group(1)
    assert project["name"] == "xsilo"
    assert project["version"] == cmake == xsilo.__version__
    assert project["dependencies"] == []  # numpy, torch, ... are extras
    with open(os.path.join(SOURCE, "python", "pyproject.toml")) as src, \
            open(os.path.join(TREE, "pyproject.toml")) as built:
        assert built.read() == src.read(), "the build tree's pyproject.toml is stale: re-run cmake"


def test_pip_installs_the_build_tree(tmp_path):
    missing = [m for m in ("pip", "setuptools", "wheel") if importlib.util.find_spec(m) is None]
    if missing:
        # scripts/install-deps.sh installs them; `make test` sets XSILO_REQUIRE_ALL=1, where a
        # test that cannot run fails instead of skipping.
        why = "needs " + ", ".join(missing) + " (Debian's python3-pip, -setuptools, -wheel)"
        if os.environ.get("XSILO_REQUIRE_ALL") == "1" or os.environ.get("CI") == "true":
            pytest.fail("prerequisite missing: " + why)
        pytest.skip(why)
    # A copy, so that setuptools' build/ and egg-info stay out of the build tree.
    src = tmp_path / "src"
    shutil.copytree(TREE, src, ignore=shutil.ignore_patterns("CMakeFiles", "__pycache__", "*.cmake",
                                                              "Makefile", "build", "*.egg-info"))
    site = tmp_path / "site"
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-build-isolation", "--no-index",
         "--no-deps", "--no-cache-dir", "--disable-pip-version-check",
         "--target", str(site), str(src)],
        capture_output=True, text=True, timeout=600)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    check = subprocess.run(
        [sys.executable, "-c",
         "import importlib.metadata as md, os, sys, xsilo, xsilo.fl\n"
         "assert xsilo.__file__.startswith(sys.argv[1]), xsilo.__file__\n"
         "d = os.path.dirname(xsilo.__file__)\n"
         "assert os.path.exists(os.path.join(d, '_xsilo.pyi'))\n"
         "assert os.path.exists(os.path.join(d, 'py.typed'))\n"
         "assert md.version('xsilo') == xsilo.__version__\n"
         "t = xsilo.tensor(bytearray(8))\n"
         "print(md.distribution('xsilo').read_text('WHEEL'))",
         str(site)],
        cwd="/", env={**os.environ, "PYTHONPATH": str(site)}, capture_output=True, text=True,
        timeout=300)
    assert check.returncode == 0, check.stdout + check.stderr
    # Tagged for this interpreter and platform, not as a pure wheel.
    tag = re.search(r"^Tag: (\S+)$", check.stdout, re.M).group(1)
    assert tag.startswith(f"cp{sys.version_info.major}{sys.version_info.minor}-"), tag
    assert not tag.endswith("-any"), tag
