"""A SigV4 presigned URL with an explicit signing time and expiry.

The algorithm is AWS's "Authenticating Requests: Using Query Parameters
(AWS Signature Version 4)" (Amazon S3 API Reference), written out here so
the expiry tests can sign at a time in the past and with any X-Amz-Expires
without patching a clock inside botocore: botocore takes the signing time
from datetime.utcnow() in whichever signer it picked (botocore.auth, or
botocore.crt.auth when python3-awscrt is installed), and the CRT signer
refuses an expiry of 0 or below (awscrt.auth.AwsSigningConfig asserts
expiration_in_seconds > 0), so neither edge could be signed through boto3 in
both configurations.

test_presign.py checks this signer against AWS's published example and
against the URL boto3 itself presigns (same time, same expiry, same
signature), whichever signer boto3 uses.
"""
import datetime
import hashlib
import hmac
import urllib.parse


def _quote(s):
    return urllib.parse.quote(s, safe="-_.~")


def _hmac(key, msg):
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def presign_v4(endpoint, access_key, secret_key, bucket, key, when, expires,
               method="GET", region="us-east-1", virtual_host=False):
    """The presigned URL of `method` on bucket/key, signed at `when` (an
    aware or UTC-naive datetime) for `expires` seconds (any integer: the
    server decides what an out-of-range value means). Path-style addressing
    on `endpoint` (http://host:port), or virtual-hosted (bucket.host)."""
    if when.tzinfo is not None:
        when = when.astimezone(datetime.timezone.utc).replace(tzinfo=None)
    amz_date = when.strftime("%Y%m%dT%H%M%SZ")
    day = amz_date[:8]
    parts = urllib.parse.urlsplit(endpoint)
    host = parts.netloc
    if virtual_host:
        host = bucket + "." + host
        path = "/" + key
    else:
        path = "/" + bucket + "/" + key
    canonical_uri = "/".join(_quote(seg) for seg in path.split("/"))
    scope = "%s/%s/s3/aws4_request" % (day, region)
    query = {
        "X-Amz-Algorithm": "AWS4-HMAC-SHA256",
        "X-Amz-Credential": "%s/%s" % (access_key, scope),
        "X-Amz-Date": amz_date,
        "X-Amz-Expires": str(expires),
        "X-Amz-SignedHeaders": "host",
    }
    canonical_query = "&".join("%s=%s" % (_quote(k), _quote(v)) for k, v in sorted(query.items()))
    canonical_request = "\n".join([method, canonical_uri, canonical_query,
                                   "host:" + host + "\n", "host", "UNSIGNED-PAYLOAD"])
    string_to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope,
                                hashlib.sha256(canonical_request.encode()).hexdigest()])
    k = _hmac(("AWS4" + secret_key).encode(), day)
    k = _hmac(k, region)
    k = _hmac(k, "s3")
    k = _hmac(k, "aws4_request")
    signature = hmac.new(k, string_to_sign.encode(), hashlib.sha256).hexdigest()
    return "%s://%s%s?%s&X-Amz-Signature=%s" % (parts.scheme, host, canonical_uri,
                                                canonical_query, signature)
