"""CopyObject (same and other bucket, zero size, metadata COPY / REPLACE,
copy-source conditions) and UploadPartCopy (whole source and ranges)."""
import datetime
import os

import pytest
from botocore.exceptions import ClientError
from conftest import error_of

PAST = datetime.datetime(2001, 1, 1, tzinfo=datetime.timezone.utc)
FUTURE = datetime.datetime(2099, 1, 1, tzinfo=datetime.timezone.utc)


@pytest.fixture
def other_bucket(s3, bucket):
    from conftest import empty_and_delete_bucket
    name = bucket + "-dst"
    s3.create_bucket(Bucket=name)
    yield name
    empty_and_delete_bucket(s3, name)


def put_source(s3, bucket, body=b"model weights", key="src"):
    return s3.put_object(Bucket=bucket, Key=key, Body=body, ContentType="text/x-weights",
                         CacheControl="no-store", Metadata={"round": "3"})["ETag"]


def test_copy_same_bucket_keeps_data_and_metadata(s3, bucket):
    etag = put_source(s3, bucket)
    r = s3.copy_object(Bucket=bucket, Key="dst", CopySource={"Bucket": bucket, "Key": "src"})
    assert r["CopyObjectResult"]["ETag"] == etag  # same bytes, single-part: same ETag
    assert "LastModified" in r["CopyObjectResult"]
    got = s3.get_object(Bucket=bucket, Key="dst")
    assert got["Body"].read() == b"model weights"
    assert got["ContentType"] == "text/x-weights"
    assert got["CacheControl"] == "no-store"
    assert got["Metadata"] == {"round": "3"}
    assert got["ETag"] == etag


def test_copy_to_other_bucket(s3, bucket, other_bucket):
    put_source(s3, bucket)
    s3.copy_object(Bucket=other_bucket, Key="a/b c", CopySource={"Bucket": bucket, "Key": "src"})
    assert s3.get_object(Bucket=other_bucket, Key="a/b c")["Body"].read() == b"model weights"
    # The source is untouched.
    assert s3.get_object(Bucket=bucket, Key="src")["Body"].read() == b"model weights"


@pytest.mark.s3rver_lacks("answers 404 for a copy source whose key needs escaping")
def test_copy_key_needing_escapes(s3, bucket):
    key = "dir/ünïcode key+plus%percent?q=1"
    s3.put_object(Bucket=bucket, Key=key, Body=b"odd")
    s3.copy_object(Bucket=bucket, Key="copy", CopySource={"Bucket": bucket, "Key": key})
    assert s3.get_object(Bucket=bucket, Key="copy")["Body"].read() == b"odd"


def test_copy_zero_size(s3, bucket):
    s3.put_object(Bucket=bucket, Key="empty", Body=b"")
    s3.copy_object(Bucket=bucket, Key="empty2", CopySource={"Bucket": bucket, "Key": "empty"})
    got = s3.get_object(Bucket=bucket, Key="empty2")
    assert got["ContentLength"] == 0 and got["Body"].read() == b""


def test_copy_replace_directive(s3, bucket):
    put_source(s3, bucket)
    s3.copy_object(Bucket=bucket, Key="dst", CopySource={"Bucket": bucket, "Key": "src"},
                   MetadataDirective="REPLACE", ContentType="application/json",
                   Metadata={"round": "4", "new": "yes"})
    got = s3.head_object(Bucket=bucket, Key="dst")
    assert got["ContentType"] == "application/json"
    assert got["Metadata"] == {"round": "4", "new": "yes"}
    assert "CacheControl" not in got  # REPLACE: nothing of the source's headers is kept


def test_copy_onto_itself_needs_replace(s3, bucket):
    put_source(s3, bucket)
    with pytest.raises(ClientError) as e:
        s3.copy_object(Bucket=bucket, Key="src", CopySource={"Bucket": bucket, "Key": "src"})
    assert error_of(e) == (400, "InvalidRequest")
    s3.copy_object(Bucket=bucket, Key="src", CopySource={"Bucket": bucket, "Key": "src"},
                   MetadataDirective="REPLACE", Metadata={"round": "9"})
    got = s3.get_object(Bucket=bucket, Key="src")
    assert got["Metadata"] == {"round": "9"} and got["Body"].read() == b"model weights"


def test_copy_missing_source(s3, bucket):
    with pytest.raises(ClientError) as e:
        s3.copy_object(Bucket=bucket, Key="dst", CopySource={"Bucket": bucket, "Key": "absent"})
    assert error_of(e) == (404, "NoSuchKey")
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=bucket, Key="dst")
    assert error_of(e)[0] == 404


def test_copy_from_missing_bucket(s3, bucket):
    with pytest.raises(ClientError) as e:
        s3.copy_object(Bucket=bucket, Key="dst", CopySource={"Bucket": "no-such-bucket-xs",
                                                             "Key": "k"})
    assert error_of(e) == (404, "NoSuchBucket")


def test_copy_to_missing_bucket(s3, bucket):
    put_source(s3, bucket)
    with pytest.raises(ClientError) as e:
        s3.copy_object(Bucket="no-such-bucket-xs", Key="dst",
                       CopySource={"Bucket": bucket, "Key": "src"})
    assert error_of(e) == (404, "NoSuchBucket")


@pytest.mark.s3rver_lacks("ignores x-amz-copy-source-if-* conditions")
def test_copy_source_conditions(s3, bucket):
    etag = put_source(s3, bucket)
    src = {"Bucket": bucket, "Key": "src"}
    s3.copy_object(Bucket=bucket, Key="d1", CopySource=src, CopySourceIfMatch=etag)
    s3.copy_object(Bucket=bucket, Key="d2", CopySource=src, CopySourceIfModifiedSince=PAST)
    s3.copy_object(Bucket=bucket, Key="d3", CopySource=src, CopySourceIfUnmodifiedSince=FUTURE)
    s3.copy_object(Bucket=bucket, Key="d4", CopySource=src, CopySourceIfNoneMatch='"other"')
    failing = [dict(CopySourceIfMatch='"other"'), dict(CopySourceIfNoneMatch=etag),
               dict(CopySourceIfModifiedSince=FUTURE), dict(CopySourceIfUnmodifiedSince=PAST)]
    for cond in failing:
        with pytest.raises(ClientError) as e:
            s3.copy_object(Bucket=bucket, Key="never", CopySource=src, **cond)
        assert error_of(e) == (412, "PreconditionFailed"), cond
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]]
    assert "never" not in keys


@pytest.mark.s3rver_lacks("does not validate x-amz-metadata-directive")
def test_copy_bad_directive(s3, bucket):
    put_source(s3, bucket)
    with pytest.raises(ClientError) as e:
        s3.copy_object(Bucket=bucket, Key="dst", CopySource={"Bucket": bucket, "Key": "src"},
                       MetadataDirective="MERGE")
    assert error_of(e)[0] == 400


def test_copy_of_multipart_object(s3, bucket):
    data = os.urandom(5 << 20) + b"tail"
    mp = s3.create_multipart_upload(Bucket=bucket, Key="mp")
    parts = []
    for n, chunk in ((1, data[:5 << 20]), (2, data[5 << 20:])):
        p = s3.upload_part(Bucket=bucket, Key="mp", UploadId=mp["UploadId"], PartNumber=n,
                           Body=chunk)
        parts.append({"PartNumber": n, "ETag": p["ETag"]})
    s3.complete_multipart_upload(Bucket=bucket, Key="mp", UploadId=mp["UploadId"],
                                 MultipartUpload={"Parts": parts})
    r = s3.copy_object(Bucket=bucket, Key="copy", CopySource={"Bucket": bucket, "Key": "mp"})
    assert s3.get_object(Bucket=bucket, Key="copy")["Body"].read() == data
    assert s3.head_object(Bucket=bucket, Key="copy")["ETag"] == r["CopyObjectResult"]["ETag"]


@pytest.mark.s3rver_lacks("UploadPartCopy is not implemented")
def test_upload_part_copy_ranges(s3, bucket, other_bucket):
    src = os.urandom((10 << 20) + 123)
    s3.put_object(Bucket=bucket, Key="src", Body=src)
    mp = s3.create_multipart_upload(Bucket=other_bucket, Key="assembled")
    uid = mp["UploadId"]
    a = s3.upload_part_copy(Bucket=other_bucket, Key="assembled", UploadId=uid, PartNumber=1,
                            CopySource={"Bucket": bucket, "Key": "src"},
                            CopySourceRange="bytes=0-%d" % ((5 << 20) - 1))
    b = s3.upload_part_copy(Bucket=other_bucket, Key="assembled", UploadId=uid, PartNumber=2,
                            CopySource={"Bucket": bucket, "Key": "src"},
                            CopySourceRange="bytes=%d-%d" % (5 << 20, len(src) - 1))
    c = s3.upload_part(Bucket=other_bucket, Key="assembled", UploadId=uid, PartNumber=3,
                       Body=b"+local")
    parts = [{"PartNumber": 1, "ETag": a["CopyPartResult"]["ETag"]},
             {"PartNumber": 2, "ETag": b["CopyPartResult"]["ETag"]},
             {"PartNumber": 3, "ETag": c["ETag"]}]
    listed = s3.list_parts(Bucket=other_bucket, Key="assembled", UploadId=uid)["Parts"]
    assert [p["Size"] for p in listed] == [5 << 20, len(src) - (5 << 20), 6]
    s3.complete_multipart_upload(Bucket=other_bucket, Key="assembled", UploadId=uid,
                                 MultipartUpload={"Parts": parts})
    assert s3.get_object(Bucket=other_bucket, Key="assembled")["Body"].read() == src + b"+local"


@pytest.mark.s3rver_lacks("UploadPartCopy is not implemented")
def test_upload_part_copy_whole_object(s3, bucket):
    s3.put_object(Bucket=bucket, Key="src", Body=b"whole")
    mp = s3.create_multipart_upload(Bucket=bucket, Key="dst")
    p = s3.upload_part_copy(Bucket=bucket, Key="dst", UploadId=mp["UploadId"], PartNumber=1,
                            CopySource={"Bucket": bucket, "Key": "src"})
    s3.complete_multipart_upload(
        Bucket=bucket, Key="dst", UploadId=mp["UploadId"],
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": p["CopyPartResult"]["ETag"]}]})
    assert s3.get_object(Bucket=bucket, Key="dst")["Body"].read() == b"whole"


@pytest.mark.s3rver_lacks("UploadPartCopy is not implemented")
def test_upload_part_copy_range_errors(s3, bucket):
    s3.put_object(Bucket=bucket, Key="src", Body=b"12345")
    mp = s3.create_multipart_upload(Bucket=bucket, Key="dst")
    args = dict(Bucket=bucket, Key="dst", UploadId=mp["UploadId"], PartNumber=1,
                CopySource={"Bucket": bucket, "Key": "src"})
    with pytest.raises(ClientError) as e:
        s3.upload_part_copy(CopySourceRange="bytes=0-21", **args)
    status, code = error_of(e)
    assert status in (400, 416) and code == "InvalidRange"
    for bad in ("bytes=3-1", "bytes=0-", "0-2"):
        with pytest.raises(ClientError) as e:
            s3.upload_part_copy(CopySourceRange=bad, **args)
        assert error_of(e) == (400, "InvalidArgument"), bad
    with pytest.raises(ClientError) as e:
        s3.upload_part_copy(**dict(args, UploadId="no-such-upload"))
    assert error_of(e) == (404, "NoSuchUpload")
    assert s3.list_parts(Bucket=bucket, Key="dst", UploadId=mp["UploadId"]).get("Parts", []) == []
