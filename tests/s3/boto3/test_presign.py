"""Presigned URLs: SigV4 query signing with every X-Amz-Expires edge, a
signing time in the past (the clock is fixed for the signer, nothing
sleeps), tampering, presigned PUT, and SigV2 query presigns refused with a
clear error."""
import contextlib
import datetime
import types
import urllib.error
import urllib.parse
import urllib.request
from unittest import mock

import botocore.auth
import pytest
from conftest import make_client


def fetch(url, method="GET", data=None):
    """(status, body) of a plain HTTP request, without credentials."""
    req = urllib.request.Request(url, method=method, data=data)
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def error_code(body):
    text = body.decode()
    return text.split("<Code>")[1].split("</Code>")[0] if "<Code>" in text else ""


@contextlib.contextmanager
def signing_clock(when):
    """botocore signs as if the time were `when` (UTC, naive)."""
    class FixedDatetime(datetime.datetime):
        @classmethod
        def utcnow(cls):
            return when

    shim = types.SimpleNamespace(datetime=FixedDatetime, timedelta=datetime.timedelta,
                                 timezone=datetime.timezone)
    with mock.patch.object(botocore.auth, "datetime", shim):
        yield


@pytest.fixture
def obj(s3, bucket):
    s3.put_object(Bucket=bucket, Key="k", Body=b"presigned body")
    return bucket


def presign(s3, bucket, expires, method="get_object", **params):
    return s3.generate_presigned_url(method, Params=dict(Bucket=bucket, Key="k", **params),
                                     ExpiresIn=expires)


def test_presigned_get(s3, obj):
    assert fetch(presign(s3, obj, 60)) == (200, b"presigned body")


def test_presigned_get_with_the_maximum_expiry(s3, obj):
    assert fetch(presign(s3, obj, 604800)) == (200, b"presigned body")


def test_expiry_above_a_week_is_refused(s3, obj):
    status, body = fetch(presign(s3, obj, 604801))
    assert (status, error_code(body)) == (400, "AuthorizationQueryParametersError")


@pytest.mark.s3rver_lacks("accepts a negative X-Amz-Expires")
def test_negative_expiry_is_refused(s3, obj):
    status, body = fetch(presign(s3, obj, -7))
    assert (status, error_code(body)) == (400, "AuthorizationQueryParametersError")
    assert b"non-negative" in body


def test_zero_expiry_is_expired(s3, obj):
    status, body = fetch(presign(s3, obj, 0))
    assert (status, error_code(body)) == (403, "AccessDenied")


def test_url_signed_in_the_past_has_expired(s3, obj):
    with signing_clock(datetime.datetime.utcnow() - datetime.timedelta(hours=2)):
        url = presign(s3, obj, 3600)
    status, body = fetch(url)
    assert (status, error_code(body)) == (403, "AccessDenied")
    assert b"expired" in body


def test_url_signed_in_the_past_still_valid(s3, obj):
    with signing_clock(datetime.datetime.utcnow() - datetime.timedelta(hours=2)):
        url = presign(s3, obj, 6 * 3600)
    assert fetch(url) == (200, b"presigned body")


@pytest.mark.s3rver_lacks("does not verify signatures")
def test_tampered_url_is_refused(s3, obj):
    url = presign(s3, obj, 60)
    status, body = fetch(url.replace("/k?", "/other?"))
    assert (status, error_code(body)) == (403, "SignatureDoesNotMatch")
    status, body = fetch(url.replace("X-Amz-Expires=60", "X-Amz-Expires=61"))
    assert (status, error_code(body)) == (403, "SignatureDoesNotMatch")


@pytest.mark.s3rver_lacks("does not verify signatures")
def test_wrong_secret_is_refused(server, obj):
    bad = make_client(server, secret_key="not-the-secret")
    status, body = fetch(presign(bad, obj, 60))
    assert (status, error_code(body)) == (403, "SignatureDoesNotMatch")


def test_presigned_put(s3, bucket):
    url = s3.generate_presigned_url("put_object", Params={"Bucket": bucket, "Key": "up"},
                                    ExpiresIn=60)
    status, _ = fetch(url, method="PUT", data=b"uploaded without credentials")
    assert status == 200
    assert s3.get_object(Bucket=bucket, Key="up")["Body"].read() == b"uploaded without credentials"


def test_presigned_head(s3, obj):
    url = s3.generate_presigned_url("head_object", Params={"Bucket": obj, "Key": "k"},
                                    ExpiresIn=60)
    assert fetch(url, method="HEAD") == (200, b"")


@pytest.mark.s3rver_lacks("accepts SigV2 query signatures")
def test_sigv2_query_presign_is_refused_clearly(server, obj):
    v2 = make_client(server, signature_version="s3")
    url = v2.generate_presigned_url("get_object", Params={"Bucket": obj, "Key": "k"}, ExpiresIn=60)
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
    assert {"AWSAccessKeyId", "Signature", "Expires"} <= set(query)
    status, body = fetch(url)
    assert (status, error_code(body)) == (400, "InvalidRequest")
    assert b"AWS4-HMAC-SHA256" in body
