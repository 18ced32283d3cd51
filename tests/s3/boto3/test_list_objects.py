"""ListObjects V1 (marker, delimiter, common prefixes, encoding-type=url,
paging) and V2, and ListObjectVersions of an unversioned bucket."""
import urllib.parse

import pytest
from conftest import error_of

KEYS = ["a/1", "a/2", "a/b/3", "b/4", "c", "d e+f", "z/5"]


@pytest.fixture
def filled(s3, bucket):
    for k in KEYS:
        s3.put_object(Bucket=bucket, Key=k, Body=k.encode())
    return bucket


def keys_of(r):
    return [o["Key"] for o in r.get("Contents", [])]


def prefixes_of(r):
    return [p["Prefix"] for p in r.get("CommonPrefixes", [])]


def test_v1_all(s3, filled):
    r = s3.list_objects(Bucket=filled)
    assert keys_of(r) == KEYS and r["IsTruncated"] is False
    assert [o["Size"] for o in r["Contents"]] == [len(k) for k in KEYS]


def test_v1_prefix_and_delimiter(s3, filled):
    r = s3.list_objects(Bucket=filled, Delimiter="/")
    assert keys_of(r) == ["c", "d e+f"]
    assert prefixes_of(r) == ["a/", "b/", "z/"]
    r = s3.list_objects(Bucket=filled, Prefix="a/", Delimiter="/")
    assert keys_of(r) == ["a/1", "a/2"] and prefixes_of(r) == ["a/b/"]
    r = s3.list_objects(Bucket=filled, Prefix="nothing")
    assert keys_of(r) == [] and r["IsTruncated"] is False


def test_v1_marker_paging(s3, filled):
    r = s3.list_objects(Bucket=filled, MaxKeys=3)
    assert keys_of(r) == KEYS[:3] and r["IsTruncated"] is True
    r = s3.list_objects(Bucket=filled, Marker=KEYS[2], MaxKeys=3)
    assert keys_of(r) == KEYS[3:6] and r["IsTruncated"] is True
    r = s3.list_objects(Bucket=filled, Marker=KEYS[5])
    assert keys_of(r) == KEYS[6:] and r["IsTruncated"] is False
    pages = s3.get_paginator("list_objects").paginate(Bucket=filled,
                                                      PaginationConfig={"PageSize": 2})
    assert [k for p in pages for k in keys_of(p)] == KEYS


@pytest.mark.s3rver_lacks("does not count common prefixes against max-keys")
def test_v1_delimiter_paging_uses_next_marker(s3, filled):
    r = s3.list_objects(Bucket=filled, Delimiter="/", MaxKeys=2)
    assert prefixes_of(r) == ["a/", "b/"] and r["IsTruncated"] is True
    assert r["NextMarker"] == "b/"
    r = s3.list_objects(Bucket=filled, Delimiter="/", Marker=r["NextMarker"])
    assert keys_of(r) == ["c", "d e+f"] and prefixes_of(r) == ["z/"]
    pages = s3.get_paginator("list_objects").paginate(Bucket=filled, Delimiter="/",
                                                      PaginationConfig={"PageSize": 1})
    got = [x for page in pages for x in keys_of(page) + prefixes_of(page)]
    assert sorted(got) == ["a/", "b/", "c", "d e+f", "z/"]


@pytest.mark.s3rver_lacks("leaves common prefixes out of KeyCount")
def test_v2_key_count_includes_common_prefixes(s3, filled):
    r = s3.list_objects_v2(Bucket=filled, Delimiter="/", Prefix="a/")
    assert r["KeyCount"] == 3


@pytest.mark.s3rver_lacks("ignores encoding-type=url")
def test_v1_encoding_type_url(s3, filled):
    # Asked for by the caller, the encoding reaches it (boto3 decodes only
    # when it asked by itself, as in test_v1_unrequested_encoding_is_decoded).
    r = s3.list_objects(Bucket=filled, EncodingType="url", Prefix="d")
    assert [urllib.parse.unquote_plus(k) for k in keys_of(r)] == ["d e+f"]
    assert " " not in keys_of(r)[0]
    r = s3.list_objects(Bucket=filled, EncodingType="url", Delimiter="/")
    assert [urllib.parse.unquote_plus(p) for p in prefixes_of(r)] == ["a/", "b/", "z/"]


def test_v1_unrequested_encoding_is_decoded(s3, filled):
    # boto3 adds encoding-type=url to every ListObjects and decodes the keys.
    assert keys_of(s3.list_objects(Bucket=filled, Prefix="d")) == ["d e+f"]


@pytest.mark.s3rver_lacks("ignores encoding-type=url")
def test_v1_encoding_type_url_on_the_wire(s3, filled):
    seen = {}

    def capture(http_response, **_):
        seen["body"] = http_response.content

    s3.meta.events.register("after-call.s3.ListObjects", capture)
    try:
        s3.list_objects(Bucket=filled, EncodingType="url", Prefix="d")
    finally:
        s3.meta.events.unregister("after-call.s3.ListObjects", capture)
    body = seen["body"].decode()
    assert "<EncodingType>url</EncodingType>" in body
    key = body.split("<Key>")[1].split("</Key>")[0]
    assert urllib.parse.unquote_plus(key) == "d e+f" and " " not in key


def test_v1_max_keys_zero(s3, filled):
    r = s3.list_objects(Bucket=filled, MaxKeys=0)
    assert keys_of(r) == [] and r["IsTruncated"] is False


def test_v2_paging_start_after_delimiter(s3, filled):
    r = s3.list_objects_v2(Bucket=filled, MaxKeys=2)
    assert keys_of(r) == KEYS[:2] and r["KeyCount"] == 2 and r["IsTruncated"] is True
    r = s3.list_objects_v2(Bucket=filled, ContinuationToken=r["NextContinuationToken"])
    assert keys_of(r) == KEYS[2:]
    r = s3.list_objects_v2(Bucket=filled, StartAfter="b/4")
    assert keys_of(r) == KEYS[4:]
    r = s3.list_objects_v2(Bucket=filled, Delimiter="/", Prefix="a/")
    assert keys_of(r) == ["a/1", "a/2"] and prefixes_of(r) == ["a/b/"]
    pages = s3.get_paginator("list_objects_v2").paginate(
        Bucket=filled, Delimiter="/", PaginationConfig={"PageSize": 1})
    got = [x for p in pages for x in keys_of(p) + prefixes_of(p)]
    assert sorted(got) == ["a/", "b/", "c", "d e+f", "z/"]


def test_v2_fetch_owner(s3, filled):
    r = s3.list_objects_v2(Bucket=filled, FetchOwner=True, MaxKeys=1)
    assert "Owner" in r["Contents"][0]
    r = s3.list_objects_v2(Bucket=filled, MaxKeys=1)
    assert "Owner" not in r["Contents"][0]


@pytest.mark.s3rver_lacks("ListObjectVersions is not implemented")
def test_list_object_versions_of_unversioned_bucket(s3, filled):
    r = s3.list_object_versions(Bucket=filled, Prefix="a/")
    assert [(v["Key"], v["VersionId"], v["IsLatest"]) for v in r["Versions"]] == [
        ("a/1", "null", True), ("a/2", "null", True), ("a/b/3", "null", True)]
    page = s3.list_object_versions(Bucket=filled, MaxKeys=2)
    assert page["IsTruncated"] is True and page["NextKeyMarker"] == "a/2"
    # DeleteObjects with VersionId "null" deletes the one version.
    s3.delete_objects(Bucket=filled, Delete={"Objects": [{"Key": "c", "VersionId": "null"}]})
    assert "c" not in keys_of(s3.list_objects(Bucket=filled))


def test_invalid_max_keys(s3, filled):
    with pytest.raises(Exception) as e:
        s3.list_objects(Bucket=filled, MaxKeys=-1)
    assert error_of(e) == (400, "InvalidArgument")


def test_v2_empty_continuation_token_starts_at_the_beginning(s3, filled):
    r = s3.list_objects_v2(Bucket=filled, ContinuationToken="")
    assert keys_of(r) == KEYS and r["IsTruncated"] is False


@pytest.mark.s3rver_lacks("accepts more than 1000 keys in one DeleteObjects")
def test_delete_objects_over_1000_keys_is_refused(s3, filled):
    objects = [{"Key": "k%d" % i} for i in range(1001)]
    with pytest.raises(Exception) as e:
        s3.delete_objects(Bucket=filled, Delete={"Objects": objects})
    assert error_of(e) == (400, "MalformedXML")
    assert keys_of(s3.list_objects(Bucket=filled)) == KEYS
