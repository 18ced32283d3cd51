#!/usr/bin/env bash
# The FedAvg main job with its object store on a RADOS Gateway:
#   xsilo fl run --transport grpc+s3 --tier medium --clients 7 --rounds 3 --store-url <gateway>
# with the keys from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (exported by
# `scripts/ceph-rgw.sh env`), held by the server alone. Checks that every
# round completed with all 7 updates, that the clients moved the models by
# presigned URLs (the gateway's access log), and that the bucket is left
# empty. Fails, with the reason, when there is no gateway.
set -euo pipefail
XSILO="${1:?usage: fl_rgw_test.sh path/to/xsilo}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

if ! env_out="$("$ROOT/scripts/ceph-rgw.sh" env)"; then
  echo "FAIL: no RADOS Gateway (${XSILO_CEPH_DIR:-/tmp/xsilo-ceph}/env is missing):" \
    "scripts/ceph-rgw.sh up brings one up; under ctest the fixture test ceph_rgw.up does" >&2
  exit 1
fi
eval "$env_out"
bucket="xsilo-fl-$$"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

"$XSILO" fl run --transport grpc+s3 --tier medium --clients 7 --rounds 3 \
  --store-url "$XSILO_RGW_ENDPOINT" --store-bucket "$bucket" --quiet --json "$out/job.json"

/usr/bin/python3 - "$out/job.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
rounds = j["rounds"]
assert len(rounds) == 3, f"{len(rounds)} rounds"
for r in rounds:
    assert r["completed"] and r["received"] == 7, f"round {r['round']}: {r['received']} updates"
assert j["final"]["clients"] == 7, j["final"]
PY

# The gateway's access lines for this bucket: presigned GETs (the clients'
# downloads) and presigned completions (their uploads through grants), 2xx.
count() { # method substring
  grep -F " beast: " "$XSILO_RGW_LOG" | grep -F "\"$1 /$bucket/" | grep -F "X-Amz-Signature=" |
    grep -F "$2" | grep -Ec '" 2[0-9][0-9] ' || true
}
completions=0
for _ in $(seq 100); do
  ceph --admin-daemon "$XSILO_RGW_ADMIN_SOCKET" log flush >/dev/null 2>&1 || true
  completions="$(count POST uploadId=)"
  [ "$completions" -ge 21 ] && break
  sleep 0.1
done
gets="$(count GET "")"
echo "presigned requests to $bucket: $gets GETs, $completions multipart completions"
[ "$gets" -ge 21 ] || { echo "FAIL: $gets presigned GETs, want >= 21 (7 clients x 3 rounds)" >&2; exit 1; }
[ "$completions" -eq 21 ] || { echo "FAIL: $completions presigned completions, want 21" >&2; exit 1; }

# Every object evicted; then the bucket goes (boto3, Debian's python3-boto3).
/usr/bin/python3 - "$bucket" <<'PY'
import os, sys, boto3
from botocore.config import Config
s3 = boto3.client("s3", endpoint_url=os.environ["XSILO_RGW_ENDPOINT"], region_name="us-east-1",
                  config=Config(signature_version="s3v4", s3={"addressing_style": "path"}))
bucket = sys.argv[1]
left = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
assert not left, f"FAIL: {len(left)} objects left in {bucket}, first {left[0]}"
uploads = s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
assert not uploads, f"FAIL: {len(uploads)} multipart uploads left in {bucket}"
s3.delete_bucket(Bucket=bucket)
PY
echo "PASS"
