"""Presigned URLs: SigV4 query signing with every X-Amz-Expires edge, a
signing time in the past (signed by sigv4_presign.presign_v4 at an explicit
time, nothing sleeps and no clock is patched), tampering, presigned PUT, and
SigV2 query presigns refused with a clear error. The same tests run with
botocore's Python signer and with the CRT signer (conftest.py,
XSILO_BOTO3_SIGNER)."""
import datetime
import urllib.error
import urllib.parse
import urllib.request

import pytest
from conftest import make_client
from sigv4_presign import presign_v4


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


def utcnow():
    return datetime.datetime.now(datetime.timezone.utc)


def presign_at(server, bucket, when, expires, method="GET", key="k"):
    """A presigned URL signed at `when` (explicitly, not through a clock)."""
    return presign_v4(server.endpoint, server.access_key, server.secret_key, bucket, key,
                      when, expires, method=method)


def query_of(url):
    return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))


def test_explicit_signer_reproduces_the_aws_example():
    # Amazon S3 API Reference, "Authenticating Requests: Using Query
    # Parameters (AWS Signature Version 4)", the presigned GET example.
    url = presign_v4("https://s3.amazonaws.com", "AKIAIOSFODNN7EXAMPLE",
                     "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "examplebucket", "test.txt",
                     datetime.datetime(2013, 5, 24, tzinfo=datetime.timezone.utc), 86400,
                     virtual_host=True)
    assert url == (
        "https://examplebucket.s3.amazonaws.com/test.txt?X-Amz-Algorithm=AWS4-HMAC-SHA256"
        "&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20130524%2Fus-east-1%2Fs3%2Faws4_request"
        "&X-Amz-Date=20130524T000000Z&X-Amz-Expires=86400&X-Amz-SignedHeaders=host"
        "&X-Amz-Signature=aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404")


def test_explicit_signer_agrees_with_boto3(server, s3, requested_signer):
    # boto3 presigns now (with the signer conftest asked for); signed at the
    # X-Amz-Date boto3 chose, the explicit signer gives the same signature.
    theirs = query_of(s3.generate_presigned_url(
        "get_object", Params={"Bucket": "some-bucket", "Key": "a key/x~y+z"}, ExpiresIn=123))
    when = datetime.datetime.strptime(theirs["X-Amz-Date"], "%Y%m%dT%H%M%SZ")
    ours = query_of(presign_v4(server.endpoint, server.access_key, server.secret_key,
                               "some-bucket", "a key/x~y+z", when, 123))
    assert ours == theirs, requested_signer


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
def test_negative_expiry_is_refused(server, obj):
    status, body = fetch(presign_at(server, obj, utcnow(), -7))
    assert (status, error_code(body)) == (400, "AuthorizationQueryParametersError")
    assert b"non-negative" in body


def test_zero_expiry_is_expired(server, obj):
    status, body = fetch(presign_at(server, obj, utcnow(), 0))
    assert (status, error_code(body)) == (403, "AccessDenied")


def test_url_signed_now_by_the_explicit_signer_is_valid(server, obj):
    # The cases below differ from this one only in their time or expiry.
    assert fetch(presign_at(server, obj, utcnow(), 3600)) == (200, b"presigned body")


def test_url_signed_in_the_past_has_expired(server, obj):
    url = presign_at(server, obj, utcnow() - datetime.timedelta(hours=2), 3600)
    status, body = fetch(url)
    assert (status, error_code(body)) == (403, "AccessDenied")
    assert b"expired" in body


def test_url_signed_in_the_past_still_valid(server, obj):
    url = presign_at(server, obj, utcnow() - datetime.timedelta(hours=2), 6 * 3600)
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
