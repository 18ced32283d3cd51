"""`xsilo s3d`'s secret options: a secret from a file or the environment,
never needed on the command line; a file others can read is refused."""
import os
import subprocess

import pytest

SECRET = "cli-test-secret-key"


def run_s3d(request, *args, env=None):
    exe = request.config.getoption("--xsilo")
    if not exe or not os.access(exe, os.X_OK):
        pytest.fail("no xsilo executable (--xsilo or $XSILO_BIN): %r" % exe)
    return subprocess.run([exe, "s3d", "--port", "0", "--memory", "--access-key", "cli-ak"] +
                          list(args), capture_output=True, text=True, timeout=60, env=env)


def test_a_secret_file_others_can_read_is_refused(request, tmp_path):
    f = tmp_path / "secret"
    f.write_text(SECRET + "\n")
    f.chmod(0o640)
    r = run_s3d(request, "--secret-key-file", str(f))
    assert r.returncode == 2, r.stderr
    assert "chmod 600" in r.stderr and str(f) in r.stderr
    assert SECRET not in r.stderr + r.stdout


def test_a_missing_or_empty_secret_file_is_refused(request, tmp_path):
    r = run_s3d(request, "--secret-key-file", str(tmp_path / "absent"))
    assert r.returncode == 2 and "cannot read the secret file" in r.stderr, r.stderr
    f = tmp_path / "empty"
    f.write_text("\n")
    f.chmod(0o600)
    r = run_s3d(request, "--secret-key-file", str(f))
    assert r.returncode == 2 and "is empty" in r.stderr, r.stderr


def test_secret_key_and_secret_key_file_are_exclusive(request, tmp_path):
    f = tmp_path / "secret"
    f.write_text(SECRET)
    f.chmod(0o600)
    r = run_s3d(request, "--secret-key", SECRET, "--secret-key-file", str(f))
    assert r.returncode == 2 and "exclusive" in r.stderr, r.stderr
