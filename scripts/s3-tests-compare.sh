#!/usr/bin/env bash
# Runs ceph/s3-tests (the Ceph project's S3 conformance suite, not vendored:
# give a checkout) against `xsilo s3d --memory` and against a RADOS Gateway
# (scripts/ceph-rgw.sh) in one run, and tabulates passed/failed per feature
# group side by side, with every case RGW passes and xsilo fails.
#
#   scripts/s3-tests-compare.sh /path/to/s3-tests [out-dir]
#
# Environment: XSILO (the xsilo binary, default build/tools/xsilo/xsilo),
# XSILO_CEPH_DIR (the RGW's state directory, default /tmp/xsilo-ceph-s3tests;
# an RGW already up there is used and left up, else one is brought up and
# torn down at the end), S3TESTS_TIMEOUT (per case, default 60 s),
# S3TESTS_ONLY=xsilo|rgw (one side), S3TESTS_K (a pytest -k expression).
# Python is Debian's /usr/bin/python3 with python3-boto3, -pytest,
# -pytest-timeout, -munch, -gevent, -isodate, -requests, -tz, -httplib2,
# -lxml, -yaml.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
S3TESTS="$(cd "${1:?usage: $0 /path/to/s3-tests [out-dir]}" && pwd)"
OUT="${2:-/tmp/s3-tests-compare}"
XSILO="${XSILO:-$ROOT/build/tools/xsilo/xsilo}"
PY=/usr/bin/python3
export XSILO_CEPH_DIR="${XSILO_CEPH_DIR:-/tmp/xsilo-ceph-s3tests}"
TIMEOUT="${S3TESTS_TIMEOUT:-60}"
ONLY="${S3TESTS_ONLY:-}"

[ -f "$S3TESTS/s3tests/functional/test_s3.py" ] || {
  echo "s3-tests-compare: $S3TESTS is not an s3-tests checkout" >&2
  exit 1
}
[ -x "$XSILO" ] || {
  echo "s3-tests-compare: $XSILO is missing (build the xsilo target, or set XSILO)" >&2
  exit 1
}
mkdir -p "$OUT"

# The features neither side is asked about (as in docs/s3.md, "Conformance:
# ceph/s3-tests"); checksum and conditional_write are in.
MARKERS="not (fails_on_aws or lifecycle or lifecycle_expiration or lifecycle_transition or
versioning or object_lock or s3website or s3website_routing_rules or s3website_redirect_location
or bucket_policy or user_policy or group_policy or role_policy or session_policy or encryption or
sse_s3 or bucket_encryption or tagging or cloud_transition or cloud_restore or s3select or sns or
storage_class or bucket_logging or bucket_logging_cleanup or fails_without_logging_rollover or
auth_aws2 or iam_account or iam_cross_account or iam_role or iam_tenant or iam_user or abac_test
or test_of_sts or webidentity_test or appendobject or object_ownership or delete_marker)"
MARKERS="$(echo "$MARKERS" | tr '\n' ' ')"

# The users of s3tests.conf.SAMPLE (vstart.sh's).
MAIN_AK=0555b35654ad1656d804
MAIN_SK='h7GhxuBLTrlhVUyxSPUKUV8r/2EI4ngqJxD7iBdBYLhwluN30JaT3Q=='
ALT_AK=NOPQRSTUVWXYZABCDEFG
ALT_SK=nopqrstuvwxyzabcdefghijklmnabcdefghijklm
ALT_ID=56789abcdef0123456789abcdef0123456789abcdef0123456789abcdef01234
TEN_AK=HIJKLMNOPQRSTUVWXYZA
TEN_SK=opqrstuvwxyzabcdefghijklmnopqrstuvwxyzab
TEN_ID=9876543210abcdef0123456789abcdef0123456789abcdef0123456789abcdef

# write_conf file port main-id main-name alt-ak alt-sk alt-id alt-name ten-ak ten-sk ten-id ten-name
write_conf() {
  cat >"$1" <<EOF
[DEFAULT]
host = localhost
port = $2
is_secure = False
ssl_verify = False
[fixtures]
bucket prefix = s3t-{random}-
iam name prefix = s3-tests-
iam path prefix = /s3-tests/
[s3 main]
display_name = $4
user_id = $3
email = tester@ceph.com
api_name = default
access_key = $MAIN_AK
secret_key = $MAIN_SK
[s3 alt]
display_name = $8
user_id = $7
email = john.doe@example.com
access_key = $5
secret_key = $6
[s3 tenant]
display_name = ${12}
user_id = ${11}
email = tenanteduser@example.com
access_key = $9
secret_key = ${10}
tenant = testx
[iam]
email = s3@example.com
user_id = 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
access_key = ABCDEFGHIJKLMNOPQRST
secret_key = abcdefghijklmnopqrstuvwxyzabcdefghijklmn
display_name = youruseridhere
[iam root]
access_key = AAAAAAAAAAAAAAAAAAaa
secret_key = aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa
user_id = RGW11111111111111111
email = account1@ceph.com
[iam alt root]
access_key = BBBBBBBBBBBBBBBBBBbb
secret_key = bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb
user_id = RGW22222222222222222
email = account2@ceph.com
EOF
}

# Cases that take the server down with them (radosgw 16.2.15 dies on
# UploadPartCopy of a percent-encoded source key): run alone, after the rest,
# so that the cases after them still meet a server.
LAST="test_upload_part_copy_percent_encoded_key"

run_suite() { # name conf
  echo "s3-tests-compare: running s3-tests against $1 (log $OUT/$1.log)" >&2
  local k="not ($LAST)" k2="$LAST"
  if [ -n "${S3TESTS_K:-}" ]; then
    k="($S3TESTS_K) and $k"
    k2="($S3TESTS_K) and $k2"
  fi
  rm -f "$OUT/$1".*.xml
  for part in 1 2; do
    local expr="$k"
    [ $part = 2 ] && expr="$k2"
    (cd "$S3TESTS" && S3TEST_CONF="$2" "$PY" -m pytest -p no:cacheprovider --timeout="$TIMEOUT" \
      -q -rN --junitxml="$OUT/$1.$part.xml" -k "$expr" \
      s3tests/functional/test_s3.py s3tests/functional/test_headers.py -m "$MARKERS") \
      >>"$OUT/$1.log" 2>&1 || true
    tail -n 1 "$OUT/$1.log" >&2
  done
}

S3D_PID=""
RGW_OURS=0
cleanup() {
  if [ -n "$S3D_PID" ]; then kill "$S3D_PID" 2>/dev/null || true; fi
  if [ "$RGW_OURS" = 1 ]; then "$ROOT/scripts/ceph-rgw.sh" down || true; fi
}
trap cleanup EXIT

if [ "$ONLY" != rgw ]; then
  # xsilo s3d: one credential, so alt and tenant are the main user.
  rm -f "$OUT/s3d.port" "$OUT/xsilo.log"
  "$XSILO" s3d --memory --port 0 --port-file "$OUT/s3d.port" --access-key "$MAIN_AK" \
    --secret-key "$MAIN_SK" >"$OUT/s3d.log" 2>&1 &
  S3D_PID=$!
  for _ in $(seq 100); do [ -s "$OUT/s3d.port" ] && break; sleep 0.1; done
  [ -s "$OUT/s3d.port" ] || {
    cat "$OUT/s3d.log" >&2
    exit 1
  }
  write_conf "$OUT/xsilo.conf" "$(cat "$OUT/s3d.port")" xsilo xsilo "$MAIN_AK" "$MAIN_SK" xsilo \
    xsilo "$MAIN_AK" "$MAIN_SK" xsilo xsilo
  echo "s3-tests-compare: xsilo s3d at git $(git -C "$ROOT" rev-parse --short HEAD)" >&2
  run_suite xsilo "$OUT/xsilo.conf"
  if ! kill -0 "$S3D_PID" 2>/dev/null; then
    echo "s3-tests-compare: xsilo s3d died during the run" | tee -a "$OUT/xsilo.log" >&2
  fi
  kill "$S3D_PID" 2>/dev/null || true
  S3D_PID=""
fi

if [ "$ONLY" != xsilo ]; then
  if ! "$ROOT/scripts/ceph-rgw.sh" status >/dev/null 2>&1; then
    "$ROOT/scripts/ceph-rgw.sh" up
    RGW_OURS=1
  fi
  eval "$("$ROOT/scripts/ceph-rgw.sh" env)"
  admin() { timeout 60 radosgw-admin -c "$CEPH_CONF" -n client.rgw.a --log-file= --admin-socket= "$@" >/dev/null 2>&1; }
  admin user info --uid testid ||
    admin user create --uid testid --display-name "M. Tester" --email tester@ceph.com \
      --access-key "$MAIN_AK" --secret "$MAIN_SK"
  admin user info --uid "$ALT_ID" ||
    admin user create --uid "$ALT_ID" --display-name john.doe --email john.doe@example.com \
      --access-key "$ALT_AK" --secret "$ALT_SK"
  admin user info --uid "testx\$$TEN_ID" ||
    admin user create --tenant testx --uid "$TEN_ID" --display-name "testx\$tenanteduser" \
      --email tenanteduser@example.com --access-key "$TEN_AK" --secret "$TEN_SK"
  write_conf "$OUT/rgw.conf" "${XSILO_RGW_ENDPOINT##*:}" testid "M. Tester" "$ALT_AK" "$ALT_SK" \
    "$ALT_ID" john.doe "$TEN_AK" "$TEN_SK" "testx\$$TEN_ID" "testx\$tenanteduser"
  rm -f "$OUT/rgw.log"
  echo "s3-tests-compare: $(radosgw --version 2>/dev/null | head -1)" >&2
  run_suite rgw "$OUT/rgw.conf"
  if ! "$ROOT/scripts/ceph-rgw.sh" status >/dev/null 2>&1; then
    echo "s3-tests-compare: the RGW was down at the end of the run" | tee -a "$OUT/rgw.log" >&2
  fi
  rm -rf "$OUT/rgw-logs"
  cp -r "$XSILO_CEPH_DIR/log" "$OUT/rgw-logs" 2>/dev/null || true
fi

"$PY" - "$OUT" <<'EOF'
import re, sys, xml.etree.ElementTree as ET
from collections import OrderedDict
out = sys.argv[1]

# First match wins. FL: the groups an FL object store needs.
GROUPS = [
    ("ACLs, policies, anonymous access", r"acl|access_bucket|policy|public_block|block_public|ignore_public|anon|raw_get(?!_x_amz)"),
    ("POST Object (browser uploads)", r"post_object"),
    ("versioning, object lock", r"versioning|versioned|object_lock"),
    ("CORS", r"cors"),
    ("checksums", r"checksum|cksum|md5|check_etag"),
    ("presign", r"presign|x_amz_expires|raw_authenticated|raw_put_authenticated|raw_response_headers"),
    ("conditionals", r"ifmatch|ifnonematch|ifmodified|ifunmodified|if_match|if_none_match"),
    ("copy", r"copy"),
    ("multipart", r"multipart|get_part"),
    ("ranges", r"range"),
    ("listing", r"bucket_list|basic_key_count|list_special_prefix"),
    ("errors", r"bad_|invalid|notexist|not_exist|nonexist|_gone|nonempty|requestid|date_and|amz_date|contentlength_none|100_continue|unreadable"),
    ("attributes, torrents", r"attributes|torrent"),
    ("buckets", r"bucket"),
    ("objects", r"object|atomic"),
]
FL = ["objects", "ranges", "multipart", "listing", "conditionals", "copy", "presign", "checksums", "errors"]

def group(name):
    for g, rx in GROUPS:
        if re.search(rx, name):
            return g
    return "other"

def load(side):
    import glob
    roots = []
    for path in sorted(glob.glob(f"{out}/{side}.*.xml")):
        try:
            roots.append(ET.parse(path).getroot())
        except ET.ParseError:
            pass
    if not roots:
        return None
    res = {}
    for tc in (t for root in roots for t in root.iter("testcase")):
        name = tc.get("name")
        bad = [c for c in tc if c.tag in ("failure", "error")]
        skip = [c for c in tc if c.tag == "skipped"]
        if bad:
            msg = (bad[0].get("message") or bad[0].text or "").strip().splitlines()
            res[name] = ("failed", msg[0][:300] if msg else "")
        elif skip:
            res[name] = ("skipped", "")
        else:
            res.setdefault(name, ("passed", ""))
    return res

x, r = load("xsilo"), load("rgw")
names = sorted(set((x or {}).keys()) | set((r or {}).keys()))
order = [g for g, _ in GROUPS] + ["other"]
rows = OrderedDict((g, {"cases": 0, "x": [0, 0, 0], "r": [0, 0, 0]}) for g in order)
idx = {"passed": 0, "failed": 1, "skipped": 2}
for n in names:
    row = rows[group(n)]
    row["cases"] += 1
    for side, res in (("x", x), ("r", r)):
        if res is not None and n in res:
            row[side][idx[res[n][0]]] += 1
lines = ["| group | cases | xsilo passed | xsilo failed | RGW passed | RGW failed |",
         "|---|---|---|---|---|---|"]
tot = {"cases": 0, "x": [0, 0, 0], "r": [0, 0, 0]}
for g, row in rows.items():
    if row["cases"] == 0:
        continue
    fl = " (FL)" if g in FL else ""
    def cell(v, i):
        return str(v[i]) + (f" (+{v[2]} skipped)" if i == 1 and v[2] else "")
    lines.append(f"| {g}{fl} | {row['cases']} | {cell(row['x'],0)} | {cell(row['x'],1)} | {cell(row['r'],0)} | {cell(row['r'],1)} |")
    tot["cases"] += row["cases"]
    for s in ("x", "r"):
        for i in range(3):
            tot[s][i] += row[s][i]
lines.append(f"| **all** | {tot['cases']} | {tot['x'][0]} | {tot['x'][1]}{f' (+{tot[chr(120)][2]} skipped)' if tot['x'][2] else ''} | {tot['r'][0]} | {tot['r'][1]}{f' (+{tot[chr(114)][2]} skipped)' if tot['r'][2] else ''} |")
lines.append("")
if x is not None and r is not None:
    lines.append("RGW passes, xsilo fails (FL groups):")
    lines.append("")
    for g in FL:
        for n in names:
            if group(n) == g and r.get(n, ("",))[0] == "passed" and x.get(n, ("",))[0] == "failed":
                lines.append(f"- {g}: `{n}`: {x[n][1]}")
    lines.append("")
    lines.append("xsilo passes, RGW fails (FL groups):")
    lines.append("")
    for g in FL:
        for n in names:
            if group(n) == g and x.get(n, ("",))[0] == "passed" and r.get(n, ("",))[0] == "failed":
                lines.append(f"- {g}: `{n}`: {r[n][1]}")
text = "\n".join(lines) + "\n"
open(f"{out}/summary.md", "w").write(text)
with open(f"{out}/cases.tsv", "w") as f:
    for n in names:
        f.write(f"{n}\t{group(n)}\t{(x or {}).get(n, ('-',))[0]}\t{(r or {}).get(n, ('-',))[0]}\n")
print(text)
EOF
echo "s3-tests-compare: $OUT/summary.md, $OUT/cases.tsv, junit XML and logs in $OUT" >&2
