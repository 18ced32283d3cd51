"""Standard object headers and x-amz-meta-* stored and returned, and the
response-* overrides of GetObject (signed and presigned)."""
import urllib.request

import pytest
from conftest import error_of

STANDARD = dict(ContentType="text/csv", CacheControl="max-age=60, private",
                ContentDisposition='attachment; filename="round-7.bin"',
                ContentEncoding="identity", ContentLanguage="en-GB",
                Metadata={"round": "7", "party": "hospital-a"})


def put_with_headers(s3, bucket, key="obj", body=b"weights"):
    s3.put_object(Bucket=bucket, Key=key, Body=body,
                  Expires="Wed, 21 Oct 2037 07:28:00 GMT", **STANDARD)


def check_standard(r):
    for name, want in STANDARD.items():
        assert r[name] == want, name
    assert r["ResponseMetadata"]["HTTPHeaders"]["expires"] == "Wed, 21 Oct 2037 07:28:00 GMT"


def test_put_stores_standard_headers_and_metadata(s3, bucket):
    put_with_headers(s3, bucket)
    check_standard(s3.head_object(Bucket=bucket, Key="obj"))
    got = s3.get_object(Bucket=bucket, Key="obj")
    check_standard(got)
    assert got["Body"].read() == b"weights"


def test_multipart_upload_stores_headers(s3, bucket):
    mp = s3.create_multipart_upload(Bucket=bucket, Key="mp",
                                    Expires="Wed, 21 Oct 2037 07:28:00 GMT", **STANDARD)
    p = s3.upload_part(Bucket=bucket, Key="mp", UploadId=mp["UploadId"], PartNumber=1, Body=b"x")
    s3.complete_multipart_upload(Bucket=bucket, Key="mp", UploadId=mp["UploadId"],
                                 MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": p["ETag"]}]})
    check_standard(s3.head_object(Bucket=bucket, Key="mp"))


def test_default_content_type_and_no_extra_headers(s3, bucket):
    s3.put_object(Bucket=bucket, Key="plain", Body=b"x")
    r = s3.head_object(Bucket=bucket, Key="plain")
    assert r["ContentType"] in ("binary/octet-stream", "application/octet-stream")
    for name in ("CacheControl", "ContentDisposition", "ContentEncoding", "ContentLanguage"):
        assert name not in r
    assert r["Metadata"] == {}


def test_overwrite_replaces_headers(s3, bucket):
    put_with_headers(s3, bucket)
    s3.put_object(Bucket=bucket, Key="obj", Body=b"v2", ContentType="text/plain")
    r = s3.head_object(Bucket=bucket, Key="obj")
    assert r["ContentType"] == "text/plain"
    assert "CacheControl" not in r and r["Metadata"] == {}


OVERRIDES = dict(ResponseContentType="application/json",
                 ResponseContentDisposition="inline",
                 ResponseCacheControl="no-cache",
                 ResponseContentEncoding="gzip",
                 ResponseContentLanguage="fr",
                 ResponseExpires="Thu, 01 Jan 2037 00:00:00 GMT")


def check_overridden(headers):
    assert headers["content-type"] == "application/json"
    assert headers["content-disposition"] == "inline"
    assert headers["cache-control"] == "no-cache"
    assert headers["content-encoding"] == "gzip"
    assert headers["content-language"] == "fr"
    assert headers["expires"] == "Thu, 01 Jan 2037 00:00:00 GMT"


def test_response_header_overrides_signed(s3, bucket):
    put_with_headers(s3, bucket)
    got = s3.get_object(Bucket=bucket, Key="obj", **OVERRIDES)
    check_overridden(got["ResponseMetadata"]["HTTPHeaders"])
    assert got["Body"].read() == b"weights"
    # Overrides last one response: the stored headers are unchanged.
    check_standard(s3.head_object(Bucket=bucket, Key="obj"))


def test_response_header_overrides_presigned(s3, bucket):
    put_with_headers(s3, bucket)
    params = dict(Bucket=bucket, Key="obj", **OVERRIDES)
    url = s3.generate_presigned_url("get_object", Params=params, ExpiresIn=300)
    with urllib.request.urlopen(url) as r:
        check_overridden({k.lower(): v for k, v in r.headers.items()})
        assert r.read() == b"weights"


def test_override_of_one_header_keeps_the_others(s3, bucket):
    put_with_headers(s3, bucket)
    got = s3.get_object(Bucket=bucket, Key="obj", ResponseContentType="text/plain")
    assert got["ContentType"] == "text/plain"
    assert got["CacheControl"] == STANDARD["CacheControl"]
    assert got["Metadata"] == STANDARD["Metadata"]


def test_missing_object_is_no_such_key(s3, bucket):
    with pytest.raises(Exception) as e:
        s3.get_object(Bucket=bucket, Key="absent", ResponseContentType="text/plain")
    assert error_of(e) == (404, "NoSuchKey")


@pytest.mark.s3rver_lacks("stores the aws-chunked content coding")
def test_aws_chunked_is_not_stored_as_a_content_encoding(s3, bucket):
    for sent, stored in [("gzip", "gzip"), ("deflate, gzip", "deflate, gzip"),
                         ("gzip, aws-chunked", "gzip"), ("aws-chunked, gzip", "gzip"),
                         ("aws-chunked", None)]:
        s3.put_object(Bucket=bucket, Key="enc", Body=b"x", ContentEncoding=sent)
        assert s3.head_object(Bucket=bucket, Key="enc").get("ContentEncoding") == stored, sent
