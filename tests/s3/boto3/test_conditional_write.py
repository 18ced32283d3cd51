"""Conditional writes: If-None-Match "*" and If-Match <ETag> on PutObject,
CopyObject and CompleteMultipartUpload, answered as S3 answers them (412
PreconditionFailed; If-Match on a missing key 404 NoSuchKey; If-None-Match
other than "*" 501). A refused write leaves the key as it was.

Debian's boto3 (1.26) predates the IfNoneMatch / IfMatch parameters of
these calls, so the headers go in through botocore's before-sign event,
which is where a newer boto3 puts them too (they are signed)."""
import pytest
from botocore.exceptions import ClientError
from conftest import error_of

pytestmark = pytest.mark.s3rver_lacks("ignores If-Match / If-None-Match on writes")

OTHER_ETAG = '"0123456789abcdef0123456789abcdef"'


def with_headers(s3, operation, headers, call):
    """Runs call() with `headers` added to every `operation` request."""
    def add(request, **_):
        for k, v in headers.items():
            request.headers[k] = v
    event = "before-sign.s3." + operation
    s3.meta.events.register(event, add)
    try:
        return call()
    finally:
        s3.meta.events.unregister(event, add)


def put(s3, bucket, body, **headers):
    return with_headers(s3, "PutObject", headers,
                        lambda: s3.put_object(Bucket=bucket, Key="k", Body=body))


def body_of(s3, bucket, key="k"):
    return s3.get_object(Bucket=bucket, Key=key)["Body"].read()


def test_if_none_match_creates_only(s3, bucket):
    etag = put(s3, bucket, b"first", **{"If-None-Match": "*"})["ETag"]
    with pytest.raises(ClientError) as e:
        put(s3, bucket, b"second", **{"If-None-Match": "*"})
    assert error_of(e) == (412, "PreconditionFailed")
    assert body_of(s3, bucket) == b"first"
    assert s3.head_object(Bucket=bucket, Key="k")["ETag"] == etag
    s3.delete_object(Bucket=bucket, Key="k")
    put(s3, bucket, b"third", **{"If-None-Match": "*"})
    assert body_of(s3, bucket) == b"third"


def test_if_none_match_takes_only_a_star(s3, bucket):
    with pytest.raises(ClientError) as e:
        put(s3, bucket, b"x", **{"If-None-Match": OTHER_ETAG})
    assert error_of(e) == (501, "NotImplemented")
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=bucket, Key="k")
    assert error_of(e)[0] == 404


def test_if_match_replaces_only_that_etag(s3, bucket):
    first = put(s3, bucket, b"first")["ETag"]
    with pytest.raises(ClientError) as e:
        put(s3, bucket, b"second", **{"If-Match": OTHER_ETAG})
    assert error_of(e) == (412, "PreconditionFailed")
    assert body_of(s3, bucket) == b"first"
    second = put(s3, bucket, b"second", **{"If-Match": first})["ETag"]
    assert body_of(s3, bucket) == b"second"
    # The old ETag no longer matches: compare-and-swap.
    with pytest.raises(ClientError) as e:
        put(s3, bucket, b"third", **{"If-Match": first})
    assert error_of(e) == (412, "PreconditionFailed")
    assert s3.head_object(Bucket=bucket, Key="k")["ETag"] == second


def test_if_match_on_a_missing_key(s3, bucket):
    with pytest.raises(ClientError) as e:
        put(s3, bucket, b"x", **{"If-Match": OTHER_ETAG})
    assert error_of(e) == (404, "NoSuchKey")
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=bucket, Key="k")
    assert error_of(e)[0] == 404


def test_copy_object_to_a_key_that_exists(s3, bucket):
    s3.put_object(Bucket=bucket, Key="src", Body=b"source")
    s3.put_object(Bucket=bucket, Key="k", Body=b"kept")

    def copy():
        return s3.copy_object(Bucket=bucket, Key="k", CopySource={"Bucket": bucket, "Key": "src"})
    with pytest.raises(ClientError) as e:
        with_headers(s3, "CopyObject", {"If-None-Match": "*"}, copy)
    assert error_of(e) == (412, "PreconditionFailed")
    assert body_of(s3, bucket) == b"kept"
    s3.delete_object(Bucket=bucket, Key="k")
    with_headers(s3, "CopyObject", {"If-None-Match": "*"}, copy)
    assert body_of(s3, bucket) == b"source"


def test_complete_multipart_upload_keeps_its_parts_when_refused(s3, bucket):
    s3.put_object(Bucket=bucket, Key="k", Body=b"kept")
    upload = s3.create_multipart_upload(Bucket=bucket, Key="k")["UploadId"]
    part = s3.upload_part(Bucket=bucket, Key="k", UploadId=upload, PartNumber=1,
                          Body=b"p" * 1024)["ETag"]
    parts = {"Parts": [{"PartNumber": 1, "ETag": part}]}

    def complete():
        return s3.complete_multipart_upload(Bucket=bucket, Key="k", UploadId=upload,
                                            MultipartUpload=parts)
    with pytest.raises(ClientError) as e:
        with_headers(s3, "CompleteMultipartUpload", {"If-None-Match": "*"}, complete)
    assert error_of(e) == (412, "PreconditionFailed")
    assert body_of(s3, bucket) == b"kept"
    # Refused, the upload is still open: its parts are listed and it completes.
    listed = s3.list_parts(Bucket=bucket, Key="k", UploadId=upload)["Parts"]
    assert [p["PartNumber"] for p in listed] == [1]
    kept = s3.head_object(Bucket=bucket, Key="k")["ETag"]
    with_headers(s3, "CompleteMultipartUpload", {"If-Match": kept}, complete)
    assert body_of(s3, bucket) == b"p" * 1024
