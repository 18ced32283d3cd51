"""Multipart uploads: ListMultipartUploads and ListParts with paging, and
the edge cases of CompleteMultipartUpload (missing part, part too small,
wrong ETag, parts out of order), after which no object exists and the
upload can still be completed correctly."""
import pytest
from botocore.exceptions import ClientError
from conftest import error_of

MIB5 = 5 << 20


def upload_parts(s3, bucket, key, sizes):
    uid = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    parts = []
    for n, size in enumerate(sizes, start=1):
        body = bytes([n]) * size
        etag = s3.upload_part(Bucket=bucket, Key=key, UploadId=uid, PartNumber=n, Body=body)["ETag"]
        parts.append({"PartNumber": n, "ETag": etag})
    return uid, parts


def assert_absent(s3, bucket, key):
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=bucket, Key=key)
    assert error_of(e)[0] == 404


@pytest.mark.s3rver_lacks("ListParts is not implemented")
def test_list_parts_and_paging(s3, bucket):
    uid, parts = upload_parts(s3, bucket, "k", [10, 20, 30, 40, 50])
    r = s3.list_parts(Bucket=bucket, Key="k", UploadId=uid)
    assert [p["PartNumber"] for p in r["Parts"]] == [1, 2, 3, 4, 5]
    assert [p["Size"] for p in r["Parts"]] == [10, 20, 30, 40, 50]
    assert [p["ETag"] for p in r["Parts"]] == [p["ETag"] for p in parts]
    assert r["IsTruncated"] is False
    page = s3.list_parts(Bucket=bucket, Key="k", UploadId=uid, MaxParts=2)
    assert [p["PartNumber"] for p in page["Parts"]] == [1, 2]
    assert page["IsTruncated"] is True and page["NextPartNumberMarker"] == 2
    rest = s3.list_parts(Bucket=bucket, Key="k", UploadId=uid, PartNumberMarker=2)
    assert [p["PartNumber"] for p in rest["Parts"]] == [3, 4, 5]
    pages = s3.get_paginator("list_parts").paginate(Bucket=bucket, Key="k", UploadId=uid,
                                                    PaginationConfig={"PageSize": 2})
    assert [p["PartNumber"] for page in pages for p in page.get("Parts", [])] == [1, 2, 3, 4, 5]


@pytest.mark.s3rver_lacks("ListParts is not implemented")
def test_list_parts_of_unknown_upload(s3, bucket):
    with pytest.raises(ClientError) as e:
        s3.list_parts(Bucket=bucket, Key="k", UploadId="no-such-upload")
    assert error_of(e) == (404, "NoSuchUpload")


@pytest.mark.s3rver_lacks("ListParts is not implemented")
def test_reuploaded_part_replaces_the_first(s3, bucket):
    uid, _ = upload_parts(s3, bucket, "k", [10])
    etag = s3.upload_part(Bucket=bucket, Key="k", UploadId=uid, PartNumber=1, Body=b"z" * 7)["ETag"]
    listed = s3.list_parts(Bucket=bucket, Key="k", UploadId=uid)["Parts"]
    assert [(p["PartNumber"], p["Size"], p["ETag"]) for p in listed] == [(1, 7, etag)]


@pytest.mark.s3rver_lacks("ListMultipartUploads is not implemented")
def test_list_multipart_uploads_paging_prefix_delimiter(s3, bucket):
    ids = {}
    for key in ["a/1", "a/2", "b/1", "c", "c"]:
        ids.setdefault(key, []).append(
            s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"])
    r = s3.list_multipart_uploads(Bucket=bucket)
    got = [(u["Key"], u["UploadId"]) for u in r["Uploads"]]
    # By key, then by initiation.
    assert got == [("a/1", ids["a/1"][0]), ("a/2", ids["a/2"][0]), ("b/1", ids["b/1"][0]),
                   ("c", ids["c"][0]), ("c", ids["c"][1])]
    assert r["IsTruncated"] is False
    assert all("Initiated" in u for u in r["Uploads"])

    page = s3.list_multipart_uploads(Bucket=bucket, MaxUploads=2)
    assert [u["Key"] for u in page["Uploads"]] == ["a/1", "a/2"]
    assert page["IsTruncated"] is True and page["NextKeyMarker"] == "a/2"
    rest = s3.list_multipart_uploads(Bucket=bucket, KeyMarker=page["NextKeyMarker"],
                                     UploadIdMarker=page["NextUploadIdMarker"])
    assert [u["Key"] for u in rest["Uploads"]] == ["b/1", "c", "c"]
    # Paging inside one key's uploads.
    mid = s3.list_multipart_uploads(Bucket=bucket, KeyMarker="c", UploadIdMarker=ids["c"][0])
    assert [u["UploadId"] for u in mid["Uploads"]] == [ids["c"][1]]
    pages = s3.get_paginator("list_multipart_uploads").paginate(
        Bucket=bucket, PaginationConfig={"PageSize": 2})
    assert [u["UploadId"] for p in pages for u in p.get("Uploads", [])] == [i for _, i in got]

    pref = s3.list_multipart_uploads(Bucket=bucket, Prefix="a/")
    assert [u["Key"] for u in pref["Uploads"]] == ["a/1", "a/2"]
    delim = s3.list_multipart_uploads(Bucket=bucket, Delimiter="/")
    assert [p["Prefix"] for p in delim["CommonPrefixes"]] == ["a/", "b/"]
    assert [u["Key"] for u in delim["Uploads"]] == ["c", "c"]

    # Completed and aborted uploads leave the listing.
    s3.abort_multipart_upload(Bucket=bucket, Key="c", UploadId=ids["c"][0])
    p = s3.upload_part(Bucket=bucket, Key="b/1", UploadId=ids["b/1"][0], PartNumber=1, Body=b"x")
    s3.complete_multipart_upload(Bucket=bucket, Key="b/1", UploadId=ids["b/1"][0],
                                 MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": p["ETag"]}]})
    left = s3.list_multipart_uploads(Bucket=bucket)["Uploads"]
    assert [u["UploadId"] for u in left] == [ids["a/1"][0], ids["a/2"][0], ids["c"][1]]


@pytest.mark.s3rver_lacks("ListMultipartUploads is not implemented")
def test_list_multipart_uploads_of_missing_bucket(s3):
    with pytest.raises(ClientError) as e:
        s3.list_multipart_uploads(Bucket="no-such-bucket-xs")
    assert error_of(e) == (404, "NoSuchBucket")


def complete(s3, bucket, key, uid, parts):
    return s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=uid,
                                        MultipartUpload={"Parts": parts})


@pytest.mark.s3rver_lacks("exits (crashes) on a Complete naming a part never uploaded")
def test_complete_with_missing_part(s3, bucket):
    uid, parts = upload_parts(s3, bucket, "k", [MIB5, 10])
    with pytest.raises(ClientError) as e:
        complete(s3, bucket, "k", uid, parts + [{"PartNumber": 3, "ETag": parts[1]["ETag"]}])
    assert error_of(e) == (400, "InvalidPart")
    assert_absent(s3, bucket, "k")
    complete(s3, bucket, "k", uid, parts)  # the failed attempt left the upload intact
    assert s3.head_object(Bucket=bucket, Key="k")["ContentLength"] == MIB5 + 10


@pytest.mark.s3rver_lacks("does not enforce the 5 MiB minimum part size")
def test_complete_with_part_too_small(s3, bucket):
    uid, parts = upload_parts(s3, bucket, "k", [10, 10])
    with pytest.raises(ClientError) as e:
        complete(s3, bucket, "k", uid, parts)
    assert error_of(e) == (400, "EntityTooSmall")
    assert_absent(s3, bucket, "k")
    complete(s3, bucket, "k", uid, parts[1:])  # the last part may be small
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"\x02" * 10


@pytest.mark.s3rver_lacks("does not check part ETags")
def test_complete_with_wrong_etag(s3, bucket):
    uid, parts = upload_parts(s3, bucket, "k", [MIB5, 10])
    bad = [parts[0], {"PartNumber": 2, "ETag": '"00000000000000000000000000000000"'}]
    with pytest.raises(ClientError) as e:
        complete(s3, bucket, "k", uid, bad)
    assert error_of(e) == (400, "InvalidPart")
    assert_absent(s3, bucket, "k")


@pytest.mark.s3rver_lacks("does not check that parts are listed in ascending order")
def test_complete_with_parts_out_of_order(s3, bucket):
    uid, parts = upload_parts(s3, bucket, "k", [MIB5, MIB5, 10])
    with pytest.raises(ClientError) as e:
        complete(s3, bucket, "k", uid, [parts[1], parts[0], parts[2]])
    assert error_of(e) == (400, "InvalidPartOrder")
    assert_absent(s3, bucket, "k")
    complete(s3, bucket, "k", uid, parts)
    body = s3.get_object(Bucket=bucket, Key="k")["Body"].read()
    assert body == b"\x01" * MIB5 + b"\x02" * MIB5 + b"\x03" * 10


def test_complete_subset_of_parts(s3, bucket):
    uid, parts = upload_parts(s3, bucket, "k", [MIB5, MIB5, 10])
    complete(s3, bucket, "k", uid, [parts[0], parts[2]])
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"\x01" * MIB5 + b"\x03" * 10


@pytest.mark.s3rver_lacks("accepts parts for an unknown upload id")
def test_unknown_upload_id(s3, bucket):
    args = dict(Bucket=bucket, Key="k", UploadId="no-such-upload")
    for call in (lambda: s3.upload_part(PartNumber=1, Body=b"x", **args),
                 lambda: complete(s3, bucket, "k", "no-such-upload",
                                  [{"PartNumber": 1, "ETag": '"x"'}]),
                 lambda: s3.abort_multipart_upload(**args)):
        with pytest.raises(ClientError) as e:
            call()
        assert error_of(e) == (404, "NoSuchUpload")


@pytest.mark.s3rver_lacks("AbortMultipartUpload is not implemented (MethodNotAllowed)")
def test_complete_after_abort_fails(s3, bucket):
    uid, parts = upload_parts(s3, bucket, "k", [10])
    s3.abort_multipart_upload(Bucket=bucket, Key="k", UploadId=uid)
    with pytest.raises(ClientError) as e:
        complete(s3, bucket, "k", uid, parts)
    assert error_of(e) == (404, "NoSuchUpload")
    assert_absent(s3, bucket, "k")


@pytest.mark.s3rver_lacks("accepts part numbers outside 1..10000")
@pytest.mark.parametrize("number", [0, 10001])
def test_part_number_out_of_range(s3, bucket, number):
    uid = s3.create_multipart_upload(Bucket=bucket, Key="k")["UploadId"]
    with pytest.raises(ClientError) as e:
        s3.upload_part(Bucket=bucket, Key="k", UploadId=uid, PartNumber=number, Body=b"x")
    assert error_of(e) == (400, "InvalidArgument")


def test_complete_with_no_parts_is_malformed(s3, bucket):
    uid, _ = upload_parts(s3, bucket, "k", [10])
    with pytest.raises(ClientError) as e:
        complete(s3, bucket, "k", uid, [])
    assert error_of(e)[0] == 400
    assert_absent(s3, bucket, "k")


@pytest.mark.s3rver_lacks("answers a repeated Complete with InternalError")
def test_complete_retried_after_success_gets_the_same_answer(s3, bucket):
    # A client whose Complete response was lost retries it.
    uid, parts = upload_parts(s3, bucket, "k", [MIB5, 10])
    first = complete(s3, bucket, "k", uid, parts)
    again = complete(s3, bucket, "k", uid, parts)
    assert again["ETag"] == first["ETag"]
    assert s3.head_object(Bucket=bucket, Key="k")["ContentLength"] == MIB5 + 10
