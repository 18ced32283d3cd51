"""boto3 (software we did not write) against the embedded S3 server.

Usage: boto3_interop.py ENDPOINT ACCESS_KEY SECRET_KEY BUCKET
Exits 0 when every check passes; prints what failed otherwise.
"""
import io
import os
import sys
import urllib.error
import urllib.request

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

endpoint, ak, sk, bucket = sys.argv[1:5]
s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=ak, aws_secret_access_key=sk,
                  region_name="us-east-1",
                  config=Config(signature_version="s3v4", s3={"addressing_style": "path"},
                                retries={"max_attempts": 1}))


def check(cond, what):
    if not cond:
        print("FAILED:", what)
        sys.exit(1)


s3.put_object(Bucket=bucket, Key="boto/small", Body=b"hello boto")
check(s3.get_object(Bucket=bucket, Key="boto/small")["Body"].read() == b"hello boto", "get")
check(s3.get_object(Bucket=bucket, Key="boto/small", Range="bytes=1-3")["Body"].read() == b"ell",
      "ranged get")
check(s3.head_object(Bucket=bucket, Key="boto/small")["ContentLength"] == 10, "head")

# Multipart by hand, then the managed transfer (parallel parts and ranges).
mp = s3.create_multipart_upload(Bucket=bucket, Key="boto/mp")
p1 = s3.upload_part(Bucket=bucket, Key="boto/mp", UploadId=mp["UploadId"], PartNumber=1,
                    Body=b"a" * (5 << 20))
p2 = s3.upload_part(Bucket=bucket, Key="boto/mp", UploadId=mp["UploadId"], PartNumber=2,
                    Body=b"b" * 10)
s3.complete_multipart_upload(
    Bucket=bucket, Key="boto/mp", UploadId=mp["UploadId"],
    MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": p1["ETag"]},
                               {"PartNumber": 2, "ETag": p2["ETag"]}]})
check(s3.head_object(Bucket=bucket, Key="boto/mp")["ContentLength"] == (5 << 20) + 10, "multipart")
aborted = s3.create_multipart_upload(Bucket=bucket, Key="boto/aborted")
s3.abort_multipart_upload(Bucket=bucket, Key="boto/aborted", UploadId=aborted["UploadId"])

data = os.urandom(24 << 20)
s3.upload_fileobj(io.BytesIO(data), bucket, "boto/managed")
out = io.BytesIO()
s3.download_fileobj(bucket, "boto/managed", out)
check(out.getvalue() == data, "managed upload/download")

keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="boto/")["Contents"]]
check(keys == ["boto/managed", "boto/mp", "boto/small"], "list: %r" % keys)
page = s3.list_objects_v2(Bucket=bucket, Prefix="boto/", MaxKeys=2)
check(page["IsTruncated"] and len(page["Contents"]) == 2, "list paging")
rest = s3.list_objects_v2(Bucket=bucket, Prefix="boto/", ContinuationToken=page["NextContinuationToken"])
check([o["Key"] for o in rest["Contents"]] == ["boto/small"], "list continuation")

url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "boto/small"},
                                ExpiresIn=60)
check(urllib.request.urlopen(url).read() == b"hello boto", "presigned url")

try:
    s3.get_object(Bucket=bucket, Key="boto/missing")
    check(False, "missing key must fail")
except ClientError as e:
    check(e.response["Error"]["Code"] == "NoSuchKey", "NoSuchKey: %r" % e.response["Error"])

bad = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=ak, aws_secret_access_key="wrong",
                   region_name="us-east-1",
                   config=Config(signature_version="s3v4", s3={"addressing_style": "path"},
                                 retries={"max_attempts": 1}))
try:
    bad.get_object(Bucket=bucket, Key="boto/small")
    check(False, "wrong secret must fail")
except ClientError as e:
    check(e.response["Error"]["Code"] == "SignatureDoesNotMatch", "wrong secret: %r" % e.response["Error"])

s3.delete_object(Bucket=bucket, Key="boto/small")
deleted = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "boto/mp"}, {"Key": "boto/managed"}]})
check(len(deleted["Deleted"]) == 2, "delete_objects")
check(s3.list_objects_v2(Bucket=bucket, Prefix="boto/")["KeyCount"] == 0, "all deleted")
print("boto3 interop: all checks passed")
