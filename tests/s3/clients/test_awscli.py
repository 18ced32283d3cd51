"""The AWS CLI v2 (Debian's awscli 2.9: `aws s3`, `aws s3api`) against
`xsilo s3d`. The CLI sends Content-MD5 (and the payload SHA-256, signed) on
every PutObject and UploadPart, which the server verifies; the tests check
that it did, and that the ETags are S3's."""
import base64
import json
import re
import urllib.parse
import zlib

import pytest
from conftest import (MiB, b64_digest, clean_env, curl_get, executable, file_md5, make_tree,
                      md5_hex,
                      multipart_etag, run, same_file, tree_files)

PART = 16 * MiB


@pytest.fixture
def aws(request, s3d, home):
    exe = executable(request, "--aws", "awscli")
    (home / ".aws").mkdir()
    config = home / "aws-config"
    config.write_text("[default]\nregion = %s\noutput = json\n"
                      "s3 =\n  multipart_threshold = %dMB\n  multipart_chunksize = %dMB\n"
                      "  max_concurrent_requests = 4\n  addressing_style = path\n"
                      % (s3d.region, PART // MiB, PART // MiB))
    creds = home / "aws-credentials"
    creds.write_text("[default]\naws_access_key_id = %s\naws_secret_access_key = %s\n"
                     % (s3d.access_key, s3d.secret_key))
    env = clean_env(home, AWS_CONFIG_FILE=config, AWS_SHARED_CREDENTIALS_FILE=creds,
                    AWS_PAGER="", AWS_EC2_METADATA_DISABLED="true")

    def call(*args, check=True, cwd=None):
        return run([exe, "--endpoint-url", s3d.endpoint, "--no-cli-pager", *args], env,
                   cwd=cwd, check=check)

    def api(*args):
        r = call("s3api", *args)
        return json.loads(r.out) if r.out.strip() else {}

    call.api = api
    call.env = env
    call.exe = exe
    return call


@pytest.fixture
def bucket(aws):
    aws("s3", "mb", "s3://aws-cli-bucket")
    return "aws-cli-bucket"


def etag(aws, bucket, key):
    return aws.api("head-object", "--bucket", bucket, "--key", key)["ETag"].strip('"')


def sent_headers(debug_log, operation):
    """The header dicts the CLI logged for each request of `operation`."""
    found = []
    for line in debug_log.splitlines():
        if "Making request for OperationModel(name=%s)" % operation in line:
            m = re.search(r"'headers': (\{[^}]*\})", line)
            found.append(m.group(1) if m else "")
    return found


def test_make_and_remove_bucket(aws):
    assert aws("s3", "mb", "s3://made-by-aws").out.strip() == "make_bucket: made-by-aws"
    aws.api("head-bucket", "--bucket", "made-by-aws")
    assert "made-by-aws" in aws("s3", "ls").out
    assert aws("s3", "rb", "s3://made-by-aws").out.strip() == "remove_bucket: made-by-aws"
    r = aws("s3api", "head-bucket", "--bucket", "made-by-aws", check=False)
    assert r.returncode != 0 and "404" in r.err
    assert "made-by-aws" not in aws("s3", "ls").out


def test_small_upload_with_content_md5(aws, bucket, tmp_path):
    data = bytes(range(256)) * 40 + b"tail"
    src = tmp_path / "small.bin"
    src.write_bytes(data)
    r = aws("s3", "cp", src, "s3://%s/dir/small.bin" % bucket, "--debug")
    puts = sent_headers(r.err, "PutObject")
    assert len(puts) == 1 and "'Content-MD5': '%s'" % b64_digest("md5", data) in puts[0]
    assert etag(aws, bucket, "dir/small.bin") == md5_hex(data)
    back = tmp_path / "back.bin"
    aws("s3", "cp", "s3://%s/dir/small.bin" % bucket, back)
    assert back.read_bytes() == data


def test_wrong_content_md5_is_refused_and_nothing_stored(aws, bucket, tmp_path):
    src = tmp_path / "x"
    src.write_bytes(b"the real bytes")
    r = aws("s3api", "put-object", "--bucket", bucket, "--key", "x", "--body", src,
            "--content-md5", b64_digest("md5", b"other bytes"), check=False)
    assert r.returncode != 0 and "BadDigest" in r.err, r.err
    r = aws("s3api", "head-object", "--bucket", bucket, "--key", "x", check=False)
    assert r.returncode != 0 and "404" in r.err


@pytest.mark.parametrize("algorithm,digest", [("SHA256", "sha256"), ("SHA1", "sha1")])
def test_flexible_checksum_is_stored_and_returned(aws, bucket, tmp_path, algorithm, digest):
    data = b"checked by a flexible checksum\n" * 100
    src = tmp_path / "c"
    src.write_bytes(data)
    put = aws.api("put-object", "--bucket", bucket, "--key", "c", "--body", src,
                  "--checksum-algorithm", algorithm)
    assert put["ETag"].strip('"') == md5_hex(data)
    head = aws.api("head-object", "--bucket", bucket, "--key", "c", "--checksum-mode", "ENABLED")
    assert head["Checksum" + algorithm] == b64_digest(digest, data)
    out = tmp_path / "c.back"
    aws.api("get-object", "--bucket", bucket, "--key", "c", "--checksum-mode", "ENABLED", out)
    assert out.read_bytes() == data


def test_crc32_checksum(aws, bucket, tmp_path):
    data = b"crc32 of these bytes" * 1000
    src = tmp_path / "c32"
    src.write_bytes(data)
    aws.api("put-object", "--bucket", bucket, "--key", "c32", "--body", src,
            "--checksum-algorithm", "CRC32")
    head = aws.api("head-object", "--bucket", bucket, "--key", "c32", "--checksum-mode",
                   "ENABLED")
    assert head["ChecksumCRC32"] == base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def test_300mb_multipart_upload_and_download(aws, bucket, big, tmp_path):
    r = aws("s3", "cp", big, "s3://%s/big.bin" % bucket, "--debug")
    parts = sent_headers(r.err, "UploadPart")
    expected_parts = -(-big.stat().st_size // PART)
    assert len(parts) == expected_parts
    assert all("'Content-MD5': '" in h for h in parts), parts[:2]
    assert etag(aws, bucket, "big.bin") == multipart_etag(big, PART)
    back = tmp_path / "big.back"
    aws("s3", "cp", "s3://%s/big.bin" % bucket, back)
    assert same_file(big, back)


def test_ranged_reads(aws, bucket, tmp_path):
    data = bytes((i * 7) & 0xFF for i in range(100000))
    src = tmp_path / "r"
    src.write_bytes(data)
    aws("s3", "cp", src, "s3://%s/r" % bucket)
    out = tmp_path / "part"
    for rng, want in (("bytes=100-199", data[100:200]), ("bytes=-50", data[-50:]),
                      ("bytes=99990-", data[99990:])):
        got = aws.api("get-object", "--bucket", bucket, "--key", "r", "--range", rng, out)
        assert out.read_bytes() == want, rng
        assert got["ContentLength"] == len(want)
        assert got["ContentRange"].endswith("/%d" % len(data))
    r = aws("s3api", "get-object", "--bucket", bucket, "--key", "r", "--range",
            "bytes=100000-", out, check=False)
    assert r.returncode != 0 and "InvalidRange" in r.err


def test_sync_twice_uploads_nothing_the_second_time(aws, bucket, tmp_path):
    files = tree_files(12)
    src = make_tree(tmp_path / "tree", files)
    first = aws("s3", "sync", src, "s3://%s/synced" % bucket)
    assert first.out.count("upload:") == 12, first.out
    second = aws("s3", "sync", src, "s3://%s/synced" % bucket)
    assert "upload:" not in second.out and second.out.strip() == "", second.out
    # A changed file (other size) is the only one uploaded next time.
    changed = src / "d1" / "f001.txt"
    changed.write_bytes(b"changed")
    third = aws("s3", "sync", src, "s3://%s/synced" % bucket)
    assert third.out.count("upload:") == 1 and "d1/f001.txt" in third.out, third.out
    down = tmp_path / "down"
    aws("s3", "sync", "s3://%s/synced" % bucket, down)
    for rel in files:
        assert (down / rel).read_bytes() == (src / rel).read_bytes(), rel


def test_copy_and_move(aws, bucket, tmp_path):
    src = tmp_path / "o"
    src.write_bytes(b"copied server-side" * 1000)
    aws("s3", "cp", src, "s3://%s/a" % bucket)
    aws("s3", "mb", "s3://aws-cli-other")
    aws("s3", "cp", "s3://%s/a" % bucket, "s3://%s/b" % bucket)
    assert etag(aws, bucket, "b") == etag(aws, bucket, "a") == file_md5(src)
    aws("s3", "mv", "s3://%s/b" % bucket, "s3://aws-cli-other/moved")
    r = aws("s3api", "head-object", "--bucket", bucket, "--key", "b", check=False)
    assert r.returncode != 0 and "404" in r.err
    out = tmp_path / "moved"
    aws("s3", "cp", "s3://aws-cli-other/moved", out)
    assert same_file(src, out)


def test_recursive_list_with_paging(aws, bucket, tmp_path):
    files = tree_files(25, size=10)
    aws("s3", "sync", make_tree(tmp_path / "t", files), "s3://%s/p" % bucket)
    r = aws("s3", "ls", "--recursive", "--page-size", "7", "s3://%s/" % bucket, "--debug")
    listed = sorted(line.split()[-1] for line in r.out.splitlines())
    assert listed == sorted("p/" + k for k in files)
    assert len(sent_headers(r.err, "ListObjectsV2")) == 4  # 7 + 7 + 7 + 4
    # s3api paging: --max-items and --starting-token over pages of 7.
    first = aws.api("list-objects-v2", "--bucket", bucket, "--page-size", "7", "--max-items", "10")
    assert len(first["Contents"]) == 10 and first["NextToken"]
    rest = aws.api("list-objects-v2", "--bucket", bucket, "--page-size", "7",
                   "--starting-token", first["NextToken"])
    keys = [o["Key"] for o in first["Contents"] + rest["Contents"]]
    assert keys == sorted("p/" + k for k in files)
    top = aws.api("list-objects-v2", "--bucket", bucket, "--prefix", "p/", "--delimiter", "/")
    assert sorted(c["Prefix"] for c in top["CommonPrefixes"]) == ["p/d0/", "p/d1/", "p/d2/"]


def test_presign_and_fetch_with_curl(request, aws, bucket, tmp_path, home):
    data = b"fetched through a presigned URL\n" * 50
    src = tmp_path / "k"
    src.write_bytes(data)
    aws("s3", "cp", src, "s3://%s/dir/k" % bucket)
    url = aws("s3", "presign", "s3://%s/dir/k" % bucket, "--expires-in", "600").out.strip()
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
    assert query["X-Amz-Algorithm"] == ["AWS4-HMAC-SHA256"] and query["X-Amz-Expires"] == ["600"]
    curl = request.config.getoption("--curl")
    assert curl_get(curl, url, home) == (200, data)
    status, body = curl_get(curl, url, home, extra=("-H", "Range: bytes=0-6"))
    assert (status, body) == (206, data[:7])
    status, body = curl_get(curl, url.replace("/dir/k?", "/dir/other?"), home)
    assert status == 403 and b"SignatureDoesNotMatch" in body


def test_delete(aws, bucket, tmp_path):
    files = tree_files(5)
    aws("s3", "sync", make_tree(tmp_path / "t", files), "s3://%s/" % bucket)
    aws("s3", "rm", "s3://%s/d0/f000.txt" % bucket)
    left = aws("s3", "ls", "--recursive", "s3://%s/" % bucket).out
    assert "d0/f000.txt" not in left and left.count("\n") == 4
    r = aws("s3", "rb", "s3://%s" % bucket, check=False)
    assert r.returncode != 0 and "BucketNotEmpty" in r.err
    aws("s3", "rm", "--recursive", "s3://%s/" % bucket)
    assert aws("s3", "ls", "--recursive", "s3://%s/" % bucket, check=False).out.strip() == ""
    aws("s3", "rb", "s3://%s" % bucket)
    assert bucket not in aws("s3", "ls").out


SPECIAL_KEY = "dir with space/ünï+cødé&=?#%~.txt"


def test_special_characters_in_keys(aws, bucket, tmp_path):
    src = tmp_path / "w"
    src.write_bytes(b"a key that needs escaping")
    aws("s3", "cp", src, "s3://%s/%s" % (bucket, SPECIAL_KEY))
    keys = [o["Key"] for o in aws.api("list-objects-v2", "--bucket", bucket)["Contents"]]
    assert keys == [SPECIAL_KEY]
    assert etag(aws, bucket, SPECIAL_KEY) == file_md5(src)
    back = tmp_path / "w.back"
    aws("s3", "cp", "s3://%s/%s" % (bucket, SPECIAL_KEY), back)
    assert same_file(src, back)


def test_streaming_upload_from_stdin(aws, s3d, bucket, tmp_path):
    # `aws s3 cp -` does not know the size: a multipart upload of
    # multipart_chunksize parts.
    data = b"".join(bytes([i]) * MiB for i in range(40))
    r = run([aws.exe, "--endpoint-url", s3d.endpoint, "s3", "cp", "-",
             "s3://%s/stream" % bucket], aws.env, input=data)
    assert r.returncode == 0
    src = tmp_path / "stream"
    src.write_bytes(data)
    assert etag(aws, bucket, "stream") == multipart_etag(src, PART)
    back = tmp_path / "stream.back"
    aws("s3", "cp", "s3://%s/stream" % bucket, back)
    assert same_file(src, back)
