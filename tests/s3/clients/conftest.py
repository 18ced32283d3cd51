"""Real S3 clients (the AWS CLI v2, s3cmd, rclone: Debian's packages,
installed by scripts/install-deps.sh) against `xsilo s3d`, with each
client's own integrity checks on.

    python3 -m pytest tests/s3/clients/test_rclone.py --storage=dir --xsilo=build/tools/xsilo/xsilo

ctest runs every file against memory and directory storage
(s3_clients.<client>.<storage>, tests/s3/CMakeLists.txt).

Every test starts its own server (--port 0 --port-file) and runs the client
with an environment built from nothing: HOME, the config files and the
temporary directory are in the test's own temporary directory, so neither
~/.aws, ~/.s3cfg, ~/.config/rclone nor AWS_* variables of the caller reach
the client. The server must still be running when the test ends.
"""
import base64
import hashlib
import os
import signal
import subprocess
import time

import pytest

ACCESS_KEY = "clients-ak"
SECRET_KEY = "clients-secret-key"
REGION = "us-east-1"
# 300 MB and not a multiple of any part size, so the last part is short.
BIG_SIZE = 300 * 1000 * 1000 + 4321
MiB = 1 << 20


def pytest_addoption(parser):
    parser.addoption("--xsilo", default=os.environ.get("XSILO_BIN", ""),
                     help="the xsilo executable")
    parser.addoption("--storage", default="memory", choices=("memory", "dir"))
    parser.addoption("--aws", default="/usr/bin/aws", help="the AWS CLI v2 (Debian's awscli)")
    parser.addoption("--s3cmd", default="/usr/bin/s3cmd")
    parser.addoption("--rclone", default="/usr/bin/rclone")
    parser.addoption("--curl", default="/usr/bin/curl")


def executable(request, option, package):
    path = request.config.getoption(option)
    if not path or not os.access(path, os.X_OK):
        pytest.fail("%s is not installed (%r): run scripts/install-deps.sh (Debian package %s), "
                    "which `make test` runs" % (option.lstrip("-"), path, package))
    return path


class S3d:
    def __init__(self, proc, port, storage, workdir):
        self.proc = proc
        self.port = port
        self.storage = storage
        self.workdir = workdir
        self.host = "127.0.0.1:%d" % port
        self.endpoint = "http://" + self.host
        self.access_key = ACCESS_KEY
        self.secret_key = SECRET_KEY
        self.region = REGION


@pytest.fixture
def s3d(request, tmp_path):
    """A fresh `xsilo s3d` for this test alone."""
    exe = request.config.getoption("--xsilo")
    if not exe or not os.access(exe, os.X_OK):
        pytest.fail("no xsilo executable (--xsilo or $XSILO_BIN): %r" % exe)
    storage = request.config.getoption("--storage")
    workdir = tmp_path / "s3d"
    workdir.mkdir()
    port_file = workdir / "port"
    # The secret from a file of mode 600, as docs/security.md asks (not argv).
    secret_file = workdir / "secret"
    secret_file.write_text(SECRET_KEY + "\n")
    secret_file.chmod(0o600)
    args = [exe, "s3d", "--port", "0", "--port-file", str(port_file),
            "--access-key", ACCESS_KEY, "--secret-key-file", str(secret_file), "--region", REGION]
    args += ["--dir", str(workdir / "objects")] if storage == "dir" else ["--memory"]
    log = open(workdir / "s3d.log", "wb")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        port = 0
        while not port:
            if proc.poll() is not None:
                pytest.fail("xsilo s3d exited with %s before writing its port: %s" % (
                    proc.returncode, (workdir / "s3d.log").read_text(errors="replace")))
            if time.monotonic() > deadline:
                pytest.fail("xsilo s3d wrote no port file within 60 s")
            try:
                port = int(port_file.read_text().strip() or 0)
            except (OSError, ValueError):
                port = 0
            if not port:
                time.sleep(0.05)
        yield S3d(proc, port, storage, workdir)
        assert proc.poll() is None, "xsilo s3d died during the test (exit %s): %s" % (
            proc.returncode, (workdir / "s3d.log").read_text(errors="replace")[-4000:])
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()


@pytest.fixture
def home(tmp_path):
    """An empty HOME (and TMPDIR) for the client."""
    h = tmp_path / "home"
    (h / "tmp").mkdir(parents=True)
    return h


def clean_env(home, **extra):
    """The client's whole environment: nothing inherited but nothing needed
    either (no AWS_*, proxies or CA bundles of the caller)."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "TMPDIR": str(home / "tmp"),
           "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "NO_PROXY": "*", "no_proxy": "*"}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run(args, env, cwd=None, timeout=900, check=True, input=None):
    """Runs a client; a failure shows its output. Timeouts are generous:
    nothing here depends on the machine's speed."""
    try:
        r = subprocess.run([str(a) for a in args], env=env, cwd=cwd, capture_output=True,
                           timeout=timeout, input=input)
    except subprocess.TimeoutExpired:
        pytest.fail("%s timed out after %d s" % (" ".join(map(str, args)), timeout))
    r.out = r.stdout.decode(errors="replace")
    r.err = r.stderr.decode(errors="replace")
    if check and r.returncode != 0:
        pytest.fail("%s exited with %d\n--- stdout\n%s\n--- stderr\n%s" % (
            " ".join(map(str, args)), r.returncode, r.out[-6000:], r.err[-6000:]))
    return r


def md5_hex(data):
    return hashlib.md5(data).hexdigest()


def file_md5(path):
    h = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(8 * MiB), b""):
            h.update(chunk)
    return h.hexdigest()


def multipart_etag(path, part_size):
    """S3's ETag of an object uploaded in parts of part_size (the last one
    shorter): hex MD5 of the concatenated binary part MD5s, '-', part count."""
    digests = []
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(part_size), b""):
            digests.append(hashlib.md5(chunk).digest())
    return "%s-%d" % (hashlib.md5(b"".join(digests)).hexdigest(), len(digests))


def b64_digest(name, data):
    return base64.b64encode(hashlib.new(name, data).digest()).decode()


def same_file(a, b):
    """Byte comparison, in chunks."""
    if os.path.getsize(a) != os.path.getsize(b):
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            x, y = fa.read(8 * MiB), fb.read(8 * MiB)
            if x != y:
                return False
            if not x:
                return True


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """A 300 MB file of random bytes, written once per module."""
    path = tmp_path_factory.mktemp("big") / "big.bin"
    with open(path, "wb") as f:
        left = BIG_SIZE
        while left:
            n = min(left, 16 * MiB)
            f.write(os.urandom(n))
            left -= n
    return path


PAST = time.time() - 24 * 3600  # mtime of the files a sync uploads (older than any upload)


def make_tree(root, files):
    """Writes {relative path: bytes} under root, each with an mtime a day
    in the past (files that existed before the sync; a client comparing
    mtimes with LastModified then depends on no clock resolution)."""
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        os.utime(p, (PAST, PAST))
    return root


def tree_files(n, size=100):
    """n small files over a few directories, distinct contents."""
    return {"d%d/f%03d.txt" % (i % 3, i): (b"%06d" % i) * (size // 6 + 1) for i in range(n)}


def curl_get(curl, url, home, extra=()):
    """(HTTP status, body) of a plain GET without credentials."""
    r = subprocess.run([curl, "-sS", "-o", "-", "-w", "\n%{http_code}", *extra, url],
                       env=clean_env(home), capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    body, _, status = r.stdout.rpartition(b"\n")
    return int(status), body
