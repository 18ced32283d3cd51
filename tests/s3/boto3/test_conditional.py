"""Conditional GET and HEAD: If-Match, If-None-Match, If-Modified-Since,
If-Unmodified-Since, answered 304 / 412 as S3 answers them (RFC 7232
order). Dates are far from the object's time, so nothing races a clock."""
import datetime

import pytest
from botocore.exceptions import ClientError
from conftest import error_of

PAST = datetime.datetime(2001, 1, 1, tzinfo=datetime.timezone.utc)
FUTURE = datetime.datetime(2099, 1, 1, tzinfo=datetime.timezone.utc)
OTHER_ETAG = '"0123456789abcdef0123456789abcdef"'


@pytest.fixture
def obj(s3, bucket):
    etag = s3.put_object(Bucket=bucket, Key="k", Body=b"conditional")["ETag"]
    return bucket, etag


def get(s3, bucket, **kw):
    return s3.get_object(Bucket=bucket, Key="k", **kw)


@pytest.mark.s3rver_lacks("ignores If-Match")
@pytest.mark.parametrize("op", ["get_object", "head_object"])
def test_if_match(s3, obj, op):
    bucket, etag = obj
    call = getattr(s3, op)
    assert call(Bucket=bucket, Key="k", IfMatch=etag)["ETag"] == etag
    assert call(Bucket=bucket, Key="k", IfMatch="*")["ETag"] == etag
    with pytest.raises(ClientError) as e:
        call(Bucket=bucket, Key="k", IfMatch=OTHER_ETAG)
    status, code = error_of(e)
    assert status == 412
    if op == "get_object":  # HEAD has no body to carry the code
        assert code == "PreconditionFailed"


@pytest.mark.s3rver_lacks("sends its 304 without the ETag header")
@pytest.mark.parametrize("op", ["get_object", "head_object"])
def test_if_none_match(s3, obj, op):
    bucket, etag = obj
    call = getattr(s3, op)
    assert call(Bucket=bucket, Key="k", IfNoneMatch=OTHER_ETAG)["ETag"] == etag
    with pytest.raises(ClientError) as e:
        call(Bucket=bucket, Key="k", IfNoneMatch=etag)
    assert error_of(e)[0] == 304
    headers = e.value.response["ResponseMetadata"]["HTTPHeaders"]
    assert headers["etag"] == etag


@pytest.mark.parametrize("op", ["get_object", "head_object"])
def test_if_modified_since(s3, obj, op):
    bucket, _ = obj
    call = getattr(s3, op)
    assert call(Bucket=bucket, Key="k", IfModifiedSince=PAST)["ContentLength"] == 11
    with pytest.raises(ClientError) as e:
        call(Bucket=bucket, Key="k", IfModifiedSince=FUTURE)
    assert error_of(e)[0] == 304


def test_if_modified_since_exactly_last_modified_is_not_modified(s3, obj):
    bucket, _ = obj
    last_modified = s3.head_object(Bucket=bucket, Key="k")["LastModified"]
    with pytest.raises(ClientError) as e:
        get(s3, bucket, IfModifiedSince=last_modified)
    assert error_of(e)[0] == 304


@pytest.mark.s3rver_lacks("ignores If-Unmodified-Since")
@pytest.mark.parametrize("op", ["get_object", "head_object"])
def test_if_unmodified_since(s3, obj, op):
    bucket, _ = obj
    call = getattr(s3, op)
    assert call(Bucket=bucket, Key="k", IfUnmodifiedSince=FUTURE)["ContentLength"] == 11
    with pytest.raises(ClientError) as e:
        call(Bucket=bucket, Key="k", IfUnmodifiedSince=PAST)
    assert error_of(e)[0] == 412


def test_if_match_true_overrides_if_unmodified_since_false(s3, obj):
    bucket, etag = obj
    r = get(s3, bucket, IfMatch=etag, IfUnmodifiedSince=PAST)
    assert r["Body"].read() == b"conditional"


def test_if_none_match_false_and_modified_since_true_is_304(s3, obj):
    bucket, etag = obj
    with pytest.raises(ClientError) as e:
        get(s3, bucket, IfNoneMatch=etag, IfModifiedSince=PAST)
    assert error_of(e)[0] == 304


@pytest.mark.s3rver_lacks("ignores If-Match")
def test_conditions_with_range(s3, obj):
    bucket, etag = obj
    r = get(s3, bucket, IfMatch=etag, Range="bytes=0-3")
    assert r["Body"].read() == b"cond"
    with pytest.raises(ClientError) as e:
        get(s3, bucket, IfMatch=OTHER_ETAG, Range="bytes=0-3")
    assert error_of(e)[0] == 412


def test_condition_on_missing_key_is_404(s3, bucket):
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="absent", IfMatch=OTHER_ETAG)
    assert error_of(e) == (404, "NoSuchKey")


@pytest.mark.s3rver_lacks("ignores If-Match")
def test_replaced_object_fails_old_etag(s3, obj):
    bucket, etag = obj
    s3.put_object(Bucket=bucket, Key="k", Body=b"replaced")
    with pytest.raises(ClientError) as e:
        get(s3, bucket, IfMatch=etag)
    assert error_of(e)[0] == 412
