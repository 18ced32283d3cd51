"""s3cmd 2.3 (Debian's) against `xsilo s3d`. s3cmd compares the MD5 of
every upload (and of every part) with the ETag the server answers and warns
and retries on a mismatch, and checks the MD5 of every download; the tests
fail on any of its MD5 warnings."""
import os

import pytest
from conftest import (MiB, clean_env, curl_get, executable, file_md5, make_tree, md5_hex,
                      multipart_etag, run, same_file, tree_files)

CHUNK_MB = 15


@pytest.fixture
def s3cmd(request, s3d, home):
    exe = executable(request, "--s3cmd", "s3cmd")
    cfg = home / "s3cfg"
    cfg.write_text("\n".join([
        "[default]",
        "access_key = " + s3d.access_key,
        "secret_key = " + s3d.secret_key,
        "host_base = " + s3d.host,
        "host_bucket = " + s3d.host,  # path-style
        "bucket_location = " + s3d.region,
        "use_https = False",
        "signature_v2 = False",
        "check_md5 = True",
        "multipart_chunk_size_mb = %d" % CHUNK_MB,
        "progress_meter = False",
        ""]))
    env = clean_env(home)

    def call(*args, check=True):
        r = run([exe, "-c", cfg, *args], env, check=check)
        if check:
            for warning in ("MD5 Sums don't match", "MD5 signatures do not match",
                            "WARNING: Upload failed", "Retrying"):
                assert warning not in r.err + r.out, r.err + r.out
        return r

    return call


@pytest.fixture
def bucket(s3cmd):
    s3cmd("mb", "s3://s3cmd-bucket")
    return "s3cmd-bucket"


def info(s3cmd, url):
    fields = {}
    for line in s3cmd("info", url).out.splitlines():
        k, sep, v = line.strip().partition(":")
        if sep:
            fields[k.strip()] = v.strip()
    return fields


def test_make_and_remove_bucket(s3cmd):
    assert "created" in s3cmd("mb", "s3://made-by-s3cmd").out
    assert "s3://made-by-s3cmd" in s3cmd("ls").out
    assert "removed" in s3cmd("rb", "s3://made-by-s3cmd").out
    assert "s3://made-by-s3cmd" not in s3cmd("ls").out


def test_small_put_and_get(s3cmd, bucket, tmp_path):
    data = b"small object for s3cmd\n" * 300
    src = tmp_path / "small"
    src.write_bytes(data)
    s3cmd("put", src, "s3://%s/dir/small" % bucket)
    assert info(s3cmd, "s3://%s/dir/small" % bucket)["MD5 sum"] == md5_hex(data)
    back = tmp_path / "back"
    s3cmd("get", "s3://%s/dir/small" % bucket, back)
    assert back.read_bytes() == data


def test_300mb_multipart_put_and_get(s3cmd, bucket, big, tmp_path):
    r = s3cmd("put", big, "s3://%s/big.bin" % bucket, "--debug")
    parts = -(-big.stat().st_size // (CHUNK_MB * MiB))
    assert r.err.count("?partNumber=") >= parts  # every part through UploadPart
    # s3cmd's info reads the MD5 it stored in x-amz-meta-s3cmd-attrs; the
    # ETag must be S3's multipart ETag.
    head = s3cmd("info", "s3://%s/big.bin" % bucket, "--debug")
    assert multipart_etag(big, CHUNK_MB * MiB) in head.err
    back = tmp_path / "big.back"
    s3cmd("get", "s3://%s/big.bin" % bucket, back)
    assert same_file(big, back)


def test_ranged_read_by_continuing_a_partial_download(s3cmd, bucket, tmp_path):
    # s3cmd's ranged GET: `get --continue` asks for the bytes a partial file lacks.
    data = os.urandom(200000)
    src = tmp_path / "r"
    src.write_bytes(data)
    s3cmd("put", src, "s3://%s/r" % bucket)
    partial = tmp_path / "r.partial"
    partial.write_bytes(data[:123457])
    r = s3cmd("get", "--continue", "s3://%s/r" % bucket, partial, "--debug")
    assert "Requesting Range: 123457 .. end" in r.err
    assert "'content-range': 'bytes 123457-199999/200000'" in r.err
    assert partial.read_bytes() == data


def test_sync_twice_uploads_nothing_the_second_time(s3cmd, bucket, tmp_path):
    files = tree_files(12)
    src = make_tree(tmp_path / "tree", files)
    first = s3cmd("sync", str(src) + "/", "s3://%s/synced/" % bucket)
    assert first.out.count("upload:") == 12, first.out
    second = s3cmd("sync", str(src) + "/", "s3://%s/synced/" % bucket)
    assert "upload:" not in second.out, second.out
    (src / "d2" / "f002.txt").write_bytes(b"changed")
    third = s3cmd("sync", str(src) + "/", "s3://%s/synced/" % bucket)
    assert third.out.count("upload:") == 1 and "d2/f002.txt" in third.out, third.out
    down = tmp_path / "down"
    down.mkdir()
    s3cmd("sync", "s3://%s/synced/" % bucket, str(down) + "/")
    for rel in files:
        assert (down / rel).read_bytes() == (src / rel).read_bytes(), rel


def test_copy_and_move(s3cmd, bucket, tmp_path):
    src = tmp_path / "o"
    src.write_bytes(b"copied by s3cmd" * 999)
    s3cmd("put", src, "s3://%s/a" % bucket)
    s3cmd("mb", "s3://s3cmd-other")
    s3cmd("cp", "s3://%s/a" % bucket, "s3://%s/b" % bucket)
    assert info(s3cmd, "s3://%s/b" % bucket)["MD5 sum"] == file_md5(src)
    s3cmd("mv", "s3://%s/b" % bucket, "s3://s3cmd-other/moved")
    assert "s3://%s/b" % bucket not in s3cmd("ls", "s3://%s/" % bucket).out
    out = tmp_path / "moved"
    s3cmd("get", "s3://s3cmd-other/moved", out)
    assert same_file(src, out)


def test_recursive_list_with_paging(s3cmd, bucket, tmp_path):
    # s3cmd lists with the server's page size (1000 keys): more than a page.
    files = tree_files(1010, size=1)
    s3cmd("sync", str(make_tree(tmp_path / "t", files)) + "/", "s3://%s/" % bucket)
    r = s3cmd("ls", "-r", "s3://%s/" % bucket, "--debug")
    listed = sorted(line.split()[-1] for line in r.out.splitlines() if "s3://" in line)
    assert listed == sorted("s3://%s/%s" % (bucket, k) for k in files)
    # ListObjects (V1): the first page is truncated, the second asks from its last key.
    assert r.err.count("format_uri(): /%s/?marker=" % bucket) == 1, r.err[-3000:]
    top = s3cmd("ls", "s3://%s/" % bucket).out
    assert sorted(line.split()[-1] for line in top.splitlines()) == [
        "s3://%s/d%d/" % (bucket, i) for i in range(3)]


def test_signurl_is_sigv2_and_refused_clearly(request, s3cmd, bucket, tmp_path, home):
    # s3cmd 2.3 presigns with SigV2 only (AWSAccessKeyId/Expires/Signature);
    # the server, like S3 regions without SigV2, answers 400 InvalidRequest
    # naming AWS4-HMAC-SHA256.
    src = tmp_path / "k"
    src.write_bytes(b"x")
    s3cmd("put", src, "s3://%s/k" % bucket)
    url = s3cmd("signurl", "s3://%s/k" % bucket, "+600").out.strip()
    assert "AWSAccessKeyId=" in url and "Signature=" in url
    status, body = curl_get(request.config.getoption("--curl"), url, home)
    assert status == 400 and b"InvalidRequest" in body and b"AWS4-HMAC-SHA256" in body


def test_delete(s3cmd, bucket, tmp_path):
    files = tree_files(5)
    s3cmd("sync", str(make_tree(tmp_path / "t", files)) + "/", "s3://%s/" % bucket)
    s3cmd("del", "s3://%s/d0/f000.txt" % bucket)
    left = s3cmd("ls", "-r", "s3://%s/" % bucket).out
    assert "d0/f000.txt" not in left and left.count("s3://") == 4
    r = s3cmd("rb", "s3://%s" % bucket, check=False)
    assert r.returncode != 0 and "BucketNotEmpty" in r.err + r.out
    s3cmd("del", "--recursive", "--force", "s3://%s/" % bucket)
    assert s3cmd("ls", "-r", "s3://%s/" % bucket).out.strip() == ""
    s3cmd("rb", "s3://%s" % bucket)
    assert "s3://%s" % bucket not in s3cmd("ls").out


SPECIAL_KEY = "dir with space/ünï+cødé&=?#%~.txt"


def test_special_characters_in_keys(s3cmd, bucket, tmp_path):
    src = tmp_path / "w"
    src.write_bytes(b"a key that needs escaping")
    s3cmd("put", src, "s3://%s/%s" % (bucket, SPECIAL_KEY))
    listed = [line.split("  s3://", 1)[1] for line in
              s3cmd("ls", "-r", "s3://%s/" % bucket).out.splitlines()]
    assert listed == ["%s/%s" % (bucket, SPECIAL_KEY)]
    assert info(s3cmd, "s3://%s/%s" % (bucket, SPECIAL_KEY))["MD5 sum"] == file_md5(src)
    back = tmp_path / "w.back"
    s3cmd("get", "s3://%s/%s" % (bucket, SPECIAL_KEY), back)
    assert same_file(src, back)
