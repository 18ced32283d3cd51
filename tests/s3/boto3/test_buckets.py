"""Bucket errors as S3 returns them: BucketAlreadyOwnedByYou,
BucketNotEmpty, NoSuchBucket on every kind of request, InvalidBucketName."""
import uuid

import pytest
from botocore.exceptions import ClientError
from conftest import error_of

MISSING = "no-such-bucket-" + uuid.uuid4().hex[:8]


@pytest.mark.s3rver_lacks("re-creating an own bucket succeeds (200)")
def test_create_existing_bucket(s3, bucket):
    with pytest.raises(ClientError) as e:
        s3.create_bucket(Bucket=bucket)
    assert error_of(e) == (409, "BucketAlreadyOwnedByYou")


def test_delete_non_empty_bucket(s3, bucket):
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    with pytest.raises(ClientError) as e:
        s3.delete_bucket(Bucket=bucket)
    assert error_of(e) == (409, "BucketNotEmpty")
    s3.head_bucket(Bucket=bucket)  # still there, with its object
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"x"


def test_delete_emptied_bucket(s3):
    name = "t-" + uuid.uuid4().hex[:20]
    s3.create_bucket(Bucket=name)
    s3.put_object(Bucket=name, Key="k", Body=b"x")
    s3.delete_object(Bucket=name, Key="k")
    s3.delete_bucket(Bucket=name)
    with pytest.raises(ClientError) as e:
        s3.head_bucket(Bucket=name)
    assert error_of(e)[0] == 404
    assert name not in [b["Name"] for b in s3.list_buckets()["Buckets"]]


@pytest.mark.parametrize("call", [
    lambda s3: s3.delete_bucket(Bucket=MISSING),
    lambda s3: s3.list_objects(Bucket=MISSING),
    lambda s3: s3.list_objects_v2(Bucket=MISSING),
    lambda s3: s3.put_object(Bucket=MISSING, Key="k", Body=b"x"),
    lambda s3: s3.get_object(Bucket=MISSING, Key="k"),
    lambda s3: s3.create_multipart_upload(Bucket=MISSING, Key="k"),
], ids=["delete_bucket", "list_objects", "list_objects_v2", "put_object", "get_object",
        "create_multipart_upload"])
def test_no_such_bucket(s3, call):
    with pytest.raises(ClientError) as e:
        call(s3)
    assert error_of(e) == (404, "NoSuchBucket")


def test_head_missing_bucket_and_object_in_it(s3):
    for call in (lambda: s3.head_bucket(Bucket=MISSING),
                 lambda: s3.head_object(Bucket=MISSING, Key="k")):
        with pytest.raises(ClientError) as e:
            call()
        assert error_of(e)[0] == 404


def test_delete_object_in_missing_bucket(s3):
    with pytest.raises(ClientError) as e:
        s3.delete_object(Bucket=MISSING, Key="k")
    assert error_of(e) == (404, "NoSuchBucket")


@pytest.mark.parametrize("name", [
    "ab", "UpperCase", "-leading", "a" * 64,
    pytest.param("under_score", marks=pytest.mark.s3rver_lacks("accepts underscores in bucket names"))])
def test_invalid_bucket_name(s3, name):
    with pytest.raises(ClientError) as e:
        s3.create_bucket(Bucket=name)
    assert error_of(e) == (400, "InvalidBucketName")


def test_list_buckets_shows_created(s3, bucket):
    assert bucket in [b["Name"] for b in s3.list_buckets()["Buckets"]]


def test_subresource_requests_never_act_as_plain_ones(s3, bucket):
    # Whether or not a server implements tagging, CORS or object lock, a
    # request for one must not overwrite the object or delete the bucket.
    s3.put_object(Bucket=bucket, Key="k", Body=b"weights")
    calls = [
        lambda: s3.put_object_tagging(Bucket=bucket, Key="k",
                                      Tagging={"TagSet": [{"Key": "a", "Value": "b"}]}),
        lambda: s3.delete_object_tagging(Bucket=bucket, Key="k"),
        lambda: s3.put_object_retention(Bucket=bucket, Key="k", Retention={
            "Mode": "GOVERNANCE", "RetainUntilDate": "2099-01-01T00:00:00Z"}),
        lambda: s3.delete_bucket_cors(Bucket=bucket),
        lambda: s3.put_bucket_versioning(Bucket=bucket,
                                         VersioningConfiguration={"Status": "Suspended"}),
    ]
    for call in calls:
        try:
            call()
        except ClientError:
            pass
        s3.head_bucket(Bucket=bucket)
        assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"weights"
