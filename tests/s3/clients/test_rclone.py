"""rclone 1.60 (Debian's) against `xsilo s3d`. rclone compares the MD5 of
every single-part upload with the ETag ("corrupted on transfer: md5 hash
differ" otherwise), stores the MD5 of a multipart upload in its metadata,
and `rclone check` compares hashes (and with --download, bytes)."""
import os
import urllib.parse

import pytest
from conftest import (MiB, clean_env, curl_get, executable, file_md5, make_tree, md5_hex,
                      multipart_etag, run, same_file, tree_files)

CHUNK = 16 * MiB


@pytest.fixture
def rclone(request, s3d, home):
    exe = executable(request, "--rclone", "rclone")
    conf = home / "rclone.conf"
    conf.write_text("\n".join([
        "[xs]",
        "type = s3",
        "provider = Other",
        "env_auth = false",
        "access_key_id = " + s3d.access_key,
        "secret_access_key = " + s3d.secret_key,
        "endpoint = " + s3d.endpoint,
        "region = " + s3d.region,
        "force_path_style = true",
        "upload_cutoff = %dM" % (CHUNK // MiB),
        "chunk_size = %dM" % (CHUNK // MiB),
        "upload_concurrency = 4",
        ""]))
    env = clean_env(home, RCLONE_CONFIG=conf)

    def call(*args, check=True):
        r = run([exe, "--retries", "1", "--low-level-retries", "1", *args], env, check=check)
        if check:
            assert "hash differ" not in r.err and "corrupted" not in r.err, r.err
        return r

    def run_input(*args, input):
        return run([exe, "--retries", "1", "--low-level-retries", "1", *args], env, input=input)

    call.run_input = run_input
    return call


@pytest.fixture
def bucket(rclone):
    rclone("mkdir", "xs:rclone-bucket")
    return "rclone-bucket"


def md5sum(rclone, remote):
    return rclone("md5sum", remote).out.split()[0]


def test_make_and_remove_bucket(rclone):
    rclone("mkdir", "xs:made-by-rclone")
    assert "made-by-rclone" in rclone("lsd", "xs:").out
    rclone("rmdir", "xs:made-by-rclone")
    assert "made-by-rclone" not in rclone("lsd", "xs:").out


def test_small_upload_checked_against_the_etag(rclone, bucket, tmp_path):
    data = b"small object for rclone\n" * 200
    src = tmp_path / "small"
    src.write_bytes(data)
    rclone("copyto", src, "xs:%s/dir/small" % bucket)
    assert md5sum(rclone, "xs:%s/dir/small" % bucket) == md5_hex(data)
    back = tmp_path / "back"
    rclone("copyto", "xs:%s/dir/small" % bucket, back)
    assert back.read_bytes() == data


def test_300mb_multipart_upload_check_and_download(rclone, bucket, big, tmp_path):
    src = big.parent
    r = rclone("copyto", big, "xs:%s/big.bin" % bucket, "-vv", "--dump", "headers")
    assert r.err.count("uploadId=") >= -(-big.stat().st_size // CHUNK)
    ls = rclone("lsjson", "--hash", "xs:%s/big.bin" % bucket).out
    assert file_md5(big) in ls  # from rclone's metadata: the ETag of a multipart is no MD5
    head = rclone("lsf", "xs:%s/big.bin" % bucket, "-vv", "--dump", "headers")
    assert multipart_etag(big, CHUNK) in head.err  # S3's multipart ETag
    r = rclone("check", src, "xs:%s" % bucket, "--one-way", "--include", "big.bin")
    assert "0 differences found" in r.err and "1 matching files" in r.err, r.err
    r = rclone("check", "--download", src, "xs:%s" % bucket, "--one-way", "--include", "big.bin")
    assert "0 differences found" in r.err, r.err
    back = tmp_path / "big.back"
    rclone("copyto", "xs:%s/big.bin" % bucket, back)
    assert same_file(big, back)


def test_ranged_reads(rclone, bucket, tmp_path):
    data = os.urandom(100000)
    src = tmp_path / "r"
    src.write_bytes(data)
    rclone("copyto", src, "xs:%s/r" % bucket)
    for offset, count in ((100, 100), (0, 1), (99990, 10), (5000, 50000)):
        got = rclone("cat", "--offset", offset, "--count", count, "xs:%s/r" % bucket).stdout
        assert got == data[offset:offset + count], (offset, count)
    assert rclone("cat", "--tail", 77, "xs:%s/r" % bucket).stdout == data[-77:]


def test_sync_twice_uploads_nothing_the_second_time(rclone, bucket, tmp_path):
    files = tree_files(12)
    src = make_tree(tmp_path / "tree", files)
    first = rclone("sync", src, "xs:%s/synced" % bucket, "-v")
    assert first.err.count("Copied (new)") == 12, first.err
    second = rclone("sync", src, "xs:%s/synced" % bucket, "-v")
    assert "Copied" not in second.err and "Updated" not in second.err, second.err
    assert "There was nothing to transfer" in second.err, second.err
    (src / "d0" / "f003.txt").write_bytes(b"changed")
    third = rclone("sync", src, "xs:%s/synced" % bucket, "-v")
    assert third.err.count("Copied (replaced existing)") == 1 and "d0/f003.txt" in third.err, \
        third.err
    r = rclone("check", src, "xs:%s/synced" % bucket)
    assert "0 differences found" in r.err and "12 matching files" in r.err, r.err


def test_copy_and_move_server_side(rclone, bucket, tmp_path):
    src = tmp_path / "o"
    src.write_bytes(b"copied by rclone" * 1000)
    rclone("copyto", src, "xs:%s/a" % bucket)
    rclone("mkdir", "xs:rclone-other")
    r = rclone("copyto", "xs:%s/a" % bucket, "xs:%s/b" % bucket, "-vv", "--dump", "headers")
    assert "X-Amz-Copy-Source" in r.err  # a CopyObject, not a download and upload
    assert md5sum(rclone, "xs:%s/b" % bucket) == file_md5(src)
    rclone("moveto", "xs:%s/b" % bucket, "xs:rclone-other/moved")
    assert rclone("lsf", "xs:%s" % bucket).out.split() == ["a"]
    out = tmp_path / "moved"
    rclone("copyto", "xs:rclone-other/moved", out)
    assert same_file(src, out)


def test_recursive_list_with_paging(rclone, bucket, tmp_path):
    files = tree_files(25, size=10)
    src = make_tree(tmp_path / "t", files)
    rclone("copy", src, "xs:%s/p" % bucket)
    r = rclone("lsf", "-R", "--files-only", "--s3-list-chunk", "7", "xs:%s" % bucket,
               "-vv", "--dump", "headers")
    assert sorted(r.out.split()) == sorted("p/" + k for k in files)
    assert r.err.count("GET /%s?" % bucket) + r.err.count("GET /%s/?" % bucket) == 4, r.err
    r = rclone("check", src, "xs:%s/p" % bucket)
    assert "25 matching files" in r.err, r.err


def test_presigned_link_fetched_with_curl(request, rclone, bucket, tmp_path, home):
    data = b"fetched through rclone link\n" * 40
    src = tmp_path / "k"
    src.write_bytes(data)
    rclone("copyto", src, "xs:%s/dir/k" % bucket)
    url = rclone("link", "--expire", "1h", "xs:%s/dir/k" % bucket).out.strip()
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
    assert query["X-Amz-Algorithm"] == ["AWS4-HMAC-SHA256"] and query["X-Amz-Expires"] == ["3600"]
    curl = request.config.getoption("--curl")
    assert curl_get(curl, url, home) == (200, data)
    status, body = curl_get(curl, url.replace("X-Amz-Expires=3600", "X-Amz-Expires=3601"), home)
    assert status == 403 and b"SignatureDoesNotMatch" in body


def test_delete(rclone, bucket, tmp_path):
    files = tree_files(5)
    rclone("copy", make_tree(tmp_path / "t", files), "xs:%s" % bucket)
    rclone("deletefile", "xs:%s/d0/f000.txt" % bucket)
    left = rclone("lsf", "-R", "--files-only", "xs:%s" % bucket).out.split()
    assert sorted(left) == sorted(k for k in files if k != "d0/f000.txt")
    r = rclone("rmdir", "xs:%s" % bucket, check=False)
    assert r.returncode != 0 and "BucketNotEmpty" in r.err, r.err
    rclone("purge", "xs:%s" % bucket)
    assert bucket not in rclone("lsd", "xs:").out


SPECIAL_KEY = "dir with space/ünï+cødé&=?#%~.txt"


def test_special_characters_in_keys(rclone, bucket, tmp_path):
    src = tmp_path / "w"
    src.write_bytes(b"a key that needs escaping")
    rclone("copyto", src, "xs:%s/%s" % (bucket, SPECIAL_KEY))
    assert rclone("lsf", "-R", "--files-only", "xs:%s" % bucket).out.splitlines() == [SPECIAL_KEY]
    assert md5sum(rclone, "xs:%s/%s" % (bucket, SPECIAL_KEY)) == file_md5(src)
    assert rclone("cat", "xs:%s/%s" % (bucket, SPECIAL_KEY)).stdout == src.read_bytes()


def test_streaming_upload_with_rcat(rclone, bucket, tmp_path):
    # rcat does not know the size: a multipart upload of chunk_size parts and
    # no MD5 in the metadata, so check compares the bytes (--download).
    data = os.urandom(23 * MiB + 7)
    rclone.run_input("rcat", "--streaming-upload-cutoff", "1M", "xs:%s/d/stream" % bucket,
                     input=data)
    src = tmp_path / "d"
    src.mkdir()
    (src / "stream").write_bytes(data)
    head = rclone("lsf", "xs:%s/d/stream" % bucket, "-vv", "--dump", "headers")
    assert multipart_etag(src / "stream", CHUNK) in head.err
    r = rclone("check", "--download", src, "xs:%s/d" % bucket)
    assert "0 differences found" in r.err and "1 matching files" in r.err, r.err
