"""boto3 against an S3 server: `xsilo s3d` (memory or directory storage) or
s3rver (npm; an S3 server we did not write), so each test checks S3's
behaviour rather than ours.

    python3 -m pytest tests/s3/boto3/test_copy.py --backend=xsilo-dir --xsilo=build/tools/xsilo/xsilo
    python3 -m pytest tests/s3/boto3/test_copy.py --backend=s3rver --s3rver=node_modules/.bin/s3rver

ctest runs every file against each backend (tests/s3/CMakeLists.txt).
Tests of behaviour s3rver does not implement carry
@pytest.mark.s3rver_lacks("why") and are deselected against it (not run,
not counted; XSILO_S3RVER_RUN_ALL=1 runs them anyway).
The server is started once per run and must still be running at the end:
a crash fails the run.

Signer: botocore signs with the AWS CRT (botocore.crt.auth) when
python3-awscrt is installed (the AWS CLI package brings it), else with its
own Python signer (botocore.auth). XSILO_BOTO3_SIGNER picks one, so that
ctest runs every file both ways (`.crt` and `.nocrt`):
  nocrt  awscrt is blocked before botocore is imported (as if not installed);
  crt    the CRT signer; without python3-awscrt the run exits with status 77
         (ctest: skipped) before collecting anything;
  unset  whatever botocore picks.
Every test checks that the signer in use is the one asked for.
"""
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid

SIGNER = os.environ.get("XSILO_BOTO3_SIGNER", "")
if SIGNER not in ("", "crt", "nocrt"):
    raise RuntimeError("XSILO_BOTO3_SIGNER must be crt, nocrt or unset, not %r" % SIGNER)
if SIGNER and "botocore" in sys.modules:
    raise RuntimeError("botocore was imported before tests/s3/boto3/conftest.py: "
                       "XSILO_BOTO3_SIGNER cannot choose its signer")
if SIGNER == "nocrt":
    sys.modules["awscrt"] = None  # `import awscrt` raises ImportError: botocore's HAS_CRT is False
elif SIGNER == "crt":
    os.environ.pop("BOTO_DISABLE_CRT", None)  # botocore's own opt-out would silently undo it

import boto3  # noqa: E402
import botocore.auth  # noqa: E402
import pytest  # noqa: E402
from botocore.config import Config  # noqa: E402

SKIP_EXIT_STATUS = 77  # SKIP_RETURN_CODE of the ctest registrations

BACKENDS = ("xsilo-memory", "xsilo-dir", "s3rver")
XSILO_KEYS = ("boto3-ak", "boto3-sk")
S3RVER_KEYS = ("S3RVER", "S3RVER")  # s3rver's built-in account


def pytest_addoption(parser):
    parser.addoption("--backend", default="xsilo-memory", choices=BACKENDS)
    parser.addoption("--xsilo", default=os.environ.get("XSILO_BIN", ""),
                     help="the xsilo executable (for xsilo-memory / xsilo-dir)")
    parser.addoption("--s3rver", default=os.environ.get("XSILO_S3RVER", ""),
                     help="the s3rver executable (node_modules/.bin/s3rver)")


def signer_module():
    """The module of the signer botocore uses for SigV4 on S3 (headers and
    presigned URLs must agree)."""
    header = botocore.auth.AUTH_TYPE_MAPS["s3v4"].__module__
    query = botocore.auth.AUTH_TYPE_MAPS["s3v4-query"].__module__
    assert header == query, (header, query)
    return header


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "s3rver_lacks(reason): s3rver does not implement this; skipped against it")
    if SIGNER == "crt" and signer_module() != "botocore.crt.auth":
        try:
            import awscrt.auth  # noqa: F401
        except ImportError:
            pytest.exit("XSILO_BOTO3_SIGNER=crt but python3-awscrt is not installed "
                        "(the .nocrt variant runs the same tests)", returncode=SKIP_EXIT_STATUS)


@pytest.fixture(autouse=True, scope="session")
def requested_signer(s3):
    """Fails every test when the client signs with another signer than the
    one XSILO_BOTO3_SIGNER asked for (the signers the client's RequestSigner
    builds for a request and for a presigned URL)."""
    used = {type(s3._request_signer.get_auth_instance("s3", "us-east-1", version)).__module__
            for version in ("s3v4", "s3v4-query")}
    assert used == {signer_module()}, used
    expected = {"crt": "botocore.crt.auth", "nocrt": "botocore.auth"}.get(SIGNER)
    if expected:
        assert used == {expected}, "XSILO_BOTO3_SIGNER=%s but botocore signs with %s" % (
            SIGNER, ", ".join(sorted(used)))
    return signer_module()


def pytest_collection_modifyitems(config, items):
    # XSILO_S3RVER_RUN_ALL=1 runs the marked tests too: to see whether a newer
    # s3rver gained a feature.
    if config.getoption("--backend") != "s3rver" or os.environ.get("XSILO_S3RVER_RUN_ALL"):
        return
    # Not run against s3rver, so not collected there: a case that does not
    # apply is deselected (pytest reports the count), never a skip that
    # counts as run.
    kept, lacking = [], []
    for item in items:
        (lacking if item.get_closest_marker("s3rver_lacks") else kept).append(item)
    if lacking:
        config.hook.pytest_deselected(items=lacking)
        items[:] = kept


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening_inodes(port):
    """Inodes of the sockets listening on 127.0.0.1/any `port` (Linux)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].split(":")[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def _listens(proc, port):
    """Whether `proc` itself listens on `port`: another test's server that
    got the same free port first is not ours (ctest runs two at once)."""
    inodes = _listening_inodes(port)
    try:
        fds = os.listdir("/proc/%d/fd" % proc.pid)
    except OSError:
        return False
    for fd in fds:
        try:
            link = os.readlink("/proc/%d/fd/%s" % (proc.pid, fd))
        except OSError:
            continue
        if link.startswith("socket:[") and link[8:-1] in inodes:
            return True
    return False


def _wait_accepting(proc, port, what):
    """True once `proc` accepts connections on `port`; False when it
    exited first (the port was taken: the caller tries another)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            if _listens(proc, port):
                return True
        except OSError:
            pass
        time.sleep(0.05)
    pytest.fail("%s did not accept connections on port %d within 30 s" % (what, port))


class Server:
    def __init__(self, backend, endpoint, keys, proc):
        self.backend = backend
        self.endpoint = endpoint
        self.access_key, self.secret_key = keys
        self.proc = proc

    @property
    def is_xsilo(self):
        return self.backend.startswith("xsilo")


@pytest.fixture(scope="session")
def server(request):
    backend = request.config.getoption("--backend")
    workdir = tempfile.mkdtemp(prefix="xsilo-boto3-")
    for attempt in range(5):  # a free port another test's server took first: another
        port = _free_port()
        proc, keys = _start_server(request, backend, workdir, port)
        if _wait_accepting(proc, port, backend):
            break
        if attempt == 4:
            pytest.fail("%s exited with %s before accepting connections" % (backend, proc.returncode))
    try:
        yield Server(backend, "http://127.0.0.1:%d" % port, keys, proc)
        assert proc.poll() is None, "%s died during the tests (exit %s)" % (backend, proc.returncode)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)


def _start_server(request, backend, workdir, port):
    if backend.startswith("xsilo"):
        exe = request.config.getoption("--xsilo")
        if not exe or not os.access(exe, os.X_OK):
            pytest.fail("no xsilo executable (--xsilo or $XSILO_BIN): %r" % exe)
        # The secret in s3d's environment, not on its command line.
        args = [exe, "s3d", "--port", str(port), "--access-key", XSILO_KEYS[0]]
        args += ["--dir", os.path.join(workdir, "objects")] if backend == "xsilo-dir" else ["--memory"]
        keys = XSILO_KEYS
        env = dict(os.environ, AWS_SECRET_ACCESS_KEY=XSILO_KEYS[1])
    else:
        exe = request.config.getoption("--s3rver")
        if not exe or not os.access(exe, os.X_OK):
            pytest.fail("s3rver is not installed (%r): run scripts/install-deps.sh, which `make "
                        "test` runs, to npm-install it" % exe)
        args = [exe, "--directory", workdir, "--address", "127.0.0.1", "--port", str(port),
                "--silent"]
        keys = S3RVER_KEYS
        # s3rver's ListObjectsV2 tokens use DES, in Node's OpenSSL 3 legacy provider only.
        env = dict(os.environ)
        env["NODE_OPTIONS"] = ("--openssl-legacy-provider " + env.get("NODE_OPTIONS", "")).strip()
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, env=env, start_new_session=True)
    return proc, keys


def make_client(server, secret_key=None, **config):
    options = dict(signature_version="s3v4", s3={"addressing_style": "path"},
                   retries={"max_attempts": 1})
    options.update(config)
    return boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1",
                        aws_access_key_id=server.access_key,
                        aws_secret_access_key=secret_key or server.secret_key,
                        config=Config(**options))


@pytest.fixture(scope="session")
def s3(server):
    return make_client(server)


def empty_and_delete_bucket(s3, name):
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=name):
        for o in page.get("Contents", []):
            s3.delete_object(Bucket=name, Key=o["Key"])
    try:
        uploads = s3.list_multipart_uploads(Bucket=name).get("Uploads", [])
    except Exception:  # a server without ListMultipartUploads
        uploads = []
    for u in uploads:
        s3.abort_multipart_upload(Bucket=name, Key=u["Key"], UploadId=u["UploadId"])
    s3.delete_bucket(Bucket=name)


@pytest.fixture
def bucket(s3):
    """A fresh, empty bucket, deleted with its objects after the test."""
    name = "t-" + uuid.uuid4().hex[:20]
    s3.create_bucket(Bucket=name)
    yield name
    empty_and_delete_bucket(s3, name)


def error_of(excinfo):
    """(HTTP status, S3 error code) of a botocore ClientError."""
    r = excinfo.value.response
    return r["ResponseMetadata"]["HTTPStatusCode"], r["Error"]["Code"]
