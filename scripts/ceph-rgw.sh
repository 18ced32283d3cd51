#!/usr/bin/env bash
# A one-node Ceph cluster with a RADOS Gateway, for tests against a real
# distributed S3 engine (Debian's ceph 16.2 "pacific": ceph-mon, ceph-mgr,
# ceph-osd, radosgw; scripts/install-deps.sh installs them).
#
#   scripts/ceph-rgw.sh up       one mon, one mgr, one OSD (memstore), one
#                                radosgw on 127.0.0.1, an S3 user with keys;
#                                waits until the cluster is healthy and the
#                                gateway answers. Already up: does nothing.
#   scripts/ceph-rgw.sh down     stops every daemon it started and removes
#                                the state directory (nothing else is left)
#   scripts/ceph-rgw.sh status   the daemons, `ceph -s`, whether rgw answers
#   scripts/ceph-rgw.sh env      shell exports: eval "$(scripts/ceph-rgw.sh env)"
#   scripts/ceph-rgw.sh rss      resident memory of each daemon (from /proc)
#
# No systemd: the daemons run directly, each with the conf, keyring-less
# (auth none: loopback only), logs, sockets, pid files and data under one
# state directory, $XSILO_CEPH_DIR (default /tmp/xsilo-ceph). Ports are
# picked free at `up` unless XSILO_CEPH_MON_PORT / XSILO_CEPH_RGW_PORT say.
# XSILO_CEPH_STORE=bluestore puts the OSD on a sparse file-backed bluestore
# (XSILO_CEPH_OSD_BYTES, default 16 GiB) instead of memstore.
set -euo pipefail

STATE="${XSILO_CEPH_DIR:-/tmp/xsilo-ceph}"
CONF="$STATE/ceph.conf"
STORE="${XSILO_CEPH_STORE:-memstore}"
OSD_BYTES="${XSILO_CEPH_OSD_BYTES:-17179869184}"
ACCESS_KEY="${XSILO_CEPH_ACCESS_KEY:-xsilo-rgw-access}"
SECRET_KEY="${XSILO_CEPH_SECRET_KEY:-xsilo-rgw-secret-key-0123456789}"
UP_TIMEOUT="${XSILO_CEPH_TIMEOUT:-180}"
DAEMONS=(rgw mgr osd mon) # stop order

log() { echo "ceph-rgw: $*" >&2; }

die() {
  log "$*"
  for f in "$STATE"/log/*.log; do
    [ -f "$f" ] || continue
    echo "---- last lines of $f ----" >&2
    tail -n 25 "$f" >&2
  done
  if [ "${UP_STARTED:-0}" = 1 ]; then
    stop_daemons
    log "stopped the daemons it had started; logs kept in $STATE/log ('down' removes them)"
  fi
  exit 1
}

need() {
  local missing=()
  for b in ceph-mon ceph-mgr ceph-osd radosgw radosgw-admin ceph monmaptool uuidgen curl python3; do
    command -v "$b" >/dev/null 2>&1 || missing+=("$b")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    log "missing: ${missing[*]} (scripts/install-deps.sh installs ceph-mon ceph-mgr ceph-osd radosgw)"
    exit 1
  fi
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

pid_of() { # daemon -> pid if it runs
  local f="$STATE/run/$1.pid"
  [ -f "$f" ] || return 1
  local p
  p="$(cat "$f" 2>/dev/null)" || return 1
  [ -n "$p" ] && kill -0 "$p" 2>/dev/null && echo "$p"
}

cephc() { timeout 30 ceph -c "$CONF" "$@"; }

rgw_answers() {
  local port
  port="$(sed -n 's/^XSILO_RGW_PORT=//p' "$STATE/ports" 2>/dev/null)"
  [ -n "$port" ] && curl -s -o /dev/null -m 2 -w '%{http_code}' "http://127.0.0.1:$port/" | grep -q '^[24]'
}

is_up() {
  for d in "${DAEMONS[@]}"; do pid_of "$d" >/dev/null || return 1; done
  [ -f "$STATE/env" ] && rgw_answers
}

wait_for() { # seconds what daemon command...: also fails at once when the daemon exits
  local secs="$1" what="$2" daemon="$3"
  shift 3
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || die "timed out after ${secs}s waiting for $what"
    pid_of "$daemon" >/dev/null || die "$daemon exited while waiting for $what"
    sleep 0.5
  done
}

health_ok() {
  local s
  s="$(cephc health 2>/dev/null)" || return 1
  [[ "$s" == HEALTH_OK* ]]
}

osd_up() { cephc osd dump 2>/dev/null | grep -q '^osd\.0 up .* in '; }

write_conf() {
  local fsid="$1" mon_port="$2" rgw_port="$3"
  cat >"$CONF" <<EOF
# Written by scripts/ceph-rgw.sh; removed by its 'down'.
[global]
fsid = $fsid
mon host = v2:127.0.0.1:$mon_port
public network = 127.0.0.0/8
ms bind ipv4 = true
ms bind ipv6 = false
auth cluster required = none
auth service required = none
auth client required = none
auth allow insecure global id reclaim = false
# auth none speaks only crc; radosgw (a daemon) would ask for secure mode alone
ms mon client mode = crc secure
client mount timeout = 30
run dir = $STATE/run
admin socket = $STATE/run/\$name.asok
pid file = $STATE/run/\$type.pid
log file = $STATE/log/\$name.log
log to stderr = false
err to stderr = true
mon cluster log file = $STATE/log/cluster.log
crash dir = $STATE/crash
keyring = /dev/null
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
mon max pg per osd = 1000
mon warn on pool no redundancy = false
mon data avail warn = 1
mon data avail crit = 0
mon osd full ratio = 0.97
mon osd backfillfull ratio = 0.95
mon osd nearfull ratio = 0.93

[mon]
mon data = $STATE/mon/\$name

[mgr]
mgr data = $STATE/mgr/\$name
mgr initial modules =

[osd]
osd data = $STATE/osd/\$id
osd objectstore = $STORE
memstore device bytes = $OSD_BYTES
bluestore block path = $STATE/osd/\$id/block.file
bluestore block create = true
bluestore block size = $OSD_BYTES
bluestore fsck on mount = false
osd memory target = 1073741824
osd max object size = 134217728
osd op num shards = 1
osd op num threads per shard = 2

[client]
admin socket =
log file =

[client.rgw.a]
admin socket = $STATE/run/\$name.asok
log file = $STATE/log/\$name.log
pid file = $STATE/run/rgw.pid
rgw frontends = beast endpoint=127.0.0.1:$rgw_port
rgw data = $STATE/rgw
rgw dns name = localhost
rgw thread pool size = 64
rgw gc obj min wait = 30
rgw gc processor period = 30
rgw gc processor max time = 30
rgw enable usage log = false
rgw s3 auth use rados = true
rgw lc debug interval = 10
EOF
}

up() {
  need
  if is_up; then
    log "already up ($STATE)"
    return 0
  fi
  if [ -e "$STATE" ]; then
    log "a stale state directory ($STATE): tearing it down first"
    down
  fi
  local start_ns
  start_ns="$(date +%s%N)"
  UP_STARTED=1
  mkdir -p "$STATE"/{run,log,crash,mon/ceph-a,mgr/ceph-x,osd/0,rgw}
  local mon_port="${XSILO_CEPH_MON_PORT:-$(free_port)}"
  local rgw_port="${XSILO_CEPH_RGW_PORT:-$(free_port)}"
  printf 'XSILO_CEPH_MON_PORT=%s\nXSILO_RGW_PORT=%s\n' "$mon_port" "$rgw_port" >"$STATE/ports"
  local fsid osd_uuid
  fsid="$(uuidgen)"
  osd_uuid="$(uuidgen)"
  write_conf "$fsid" "$mon_port" "$rgw_port"

  log "mon (127.0.0.1:$mon_port)"
  monmaptool --create --fsid "$fsid" --addv a "[v2:127.0.0.1:$mon_port]" "$STATE/monmap" >/dev/null ||
    die "monmaptool failed"
  ceph-mon -c "$CONF" -i a --mkfs --monmap "$STATE/monmap" >>"$STATE/log/setup.log" 2>&1 ||
    die "ceph-mon --mkfs failed"
  ceph-mon -c "$CONF" -i a >>"$STATE/log/setup.log" 2>&1 || die "ceph-mon did not start"
  wait_for 60 "the monitor" mon cephc mon stat

  log "mgr"
  ceph-mgr -c "$CONF" -i x >>"$STATE/log/setup.log" 2>&1 || die "ceph-mgr did not start"

  log "osd ($STORE)"
  local id
  id="$(cephc osd new "$osd_uuid" 2>>"$STATE/log/setup.log")" || die "ceph osd new failed"
  [ "$id" = 0 ] || die "unexpected OSD id '$id'"
  ceph-osd -c "$CONF" -i 0 --mkfs --osd-uuid "$osd_uuid" >>"$STATE/log/setup.log" 2>&1 ||
    die "ceph-osd --mkfs failed"
  ceph-osd -c "$CONF" -i 0 >>"$STATE/log/setup.log" 2>&1 || die "ceph-osd did not start"
  wait_for 90 "osd.0 up and in" osd osd_up

  log "rgw (127.0.0.1:$rgw_port)"
  radosgw -c "$CONF" -n client.rgw.a >>"$STATE/log/setup.log" 2>&1 || die "radosgw did not start"
  wait_for "$UP_TIMEOUT" "radosgw to answer on 127.0.0.1:$rgw_port" rgw rgw_answers

  log "S3 user"
  timeout 60 radosgw-admin -c "$CONF" -n client.rgw.a --log-file= --admin-socket= \
    user create --uid xsilo --display-name "xsilo tests" \
    --access-key "$ACCESS_KEY" --secret "$SECRET_KEY" >>"$STATE/log/setup.log" 2>&1 ||
    die "radosgw-admin user create failed"
  wait_for 60 "HEALTH_OK" mon health_ok
  for d in "${DAEMONS[@]}"; do pid_of "$d" >/dev/null || die "$d exited"; done

  cat >"$STATE/env" <<EOF
export XSILO_RGW_ENDPOINT=http://127.0.0.1:$rgw_port
export XSILO_RGW_ACCESS_KEY=$ACCESS_KEY
export XSILO_RGW_SECRET_KEY=$SECRET_KEY
export XSILO_RGW_REGION=us-east-1
export AWS_ACCESS_KEY_ID=$ACCESS_KEY
export AWS_SECRET_ACCESS_KEY=$SECRET_KEY
export AWS_DEFAULT_REGION=us-east-1
export AWS_ENDPOINT_URL=http://127.0.0.1:$rgw_port
export CEPH_CONF=$CONF
export XSILO_RGW_LOG=$STATE/log/client.rgw.a.log
export XSILO_RGW_ADMIN_SOCKET=$STATE/run/client.rgw.a.asok
EOF
  UP_STARTED=0
  local ms=$((($(date +%s%N) - start_ns) / 1000000))
  echo "$ms" >"$STATE/up_ms"
  log "up in $((ms / 1000)).$(printf '%03d' $((ms % 1000))) s: http://127.0.0.1:$rgw_port ($STATE)"
}

stop_daemons() {
  local pids=() p
  for d in "${DAEMONS[@]}"; do
    if p="$(pid_of "$d")"; then
      pids+=("$p")
      # memstore would write every object to disk on a clean shutdown, and the
      # data goes anyway: the OSD is killed outright.
      if [ "$d" = osd ]; then kill -KILL "$p" 2>/dev/null || true; else kill -TERM "$p" 2>/dev/null || true; fi
    fi
  done
  local deadline=$((SECONDS + 5))
  for p in "${pids[@]}"; do
    while kill -0 "$p" 2>/dev/null; do
      if [ $SECONDS -ge $deadline ]; then
        kill -KILL "$p" 2>/dev/null || true
        sleep 0.2
      else
        sleep 0.2
      fi
    done
  done
}

down() {
  UP_STARTED=0
  stop_daemons
  if [ -e "$STATE" ]; then
    case "$STATE" in
      / | /tmp | /tmp/ | "$HOME") die "refusing to remove $STATE" ;;
    esac
    rm -rf "$STATE"
  fi
  log "down"
}

status() {
  local rc=0
  for d in mon mgr osd rgw; do
    if p="$(pid_of "$d")"; then echo "$d: running, pid $p"; else
      echo "$d: not running"
      rc=1
    fi
  done
  if [ -f "$CONF" ]; then cephc -s 2>&1 || rc=1; fi
  if rgw_answers; then echo "rgw: answers at $(sed -n 's/^export XSILO_RGW_ENDPOINT=//p' "$STATE/env" 2>/dev/null)"; else
    echo "rgw: does not answer"
    rc=1
  fi
  return $rc
}

rss() {
  local total=0 kb
  for d in mon mgr osd rgw; do
    if p="$(pid_of "$d")"; then
      kb="$(awk '/^VmRSS:/ {print $2}' "/proc/$p/status")"
      hwm="$(awk '/^VmHWM:/ {print $2}' "/proc/$p/status")"
      printf '%s: pid %s VmRSS %d MiB, VmHWM %d MiB\n' "$d" "$p" $((kb / 1024)) $((hwm / 1024))
      total=$((total + kb))
    fi
  done
  printf 'total VmRSS %d MiB\n' $((total / 1024))
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  env)
    [ -f "$STATE/env" ] || {
      log "not up ($STATE/env missing): run scripts/ceph-rgw.sh up"
      exit 1
    }
    cat "$STATE/env"
    ;;
  rss) rss ;;
  *)
    echo "usage: $0 up|down|status|env|rss   (state: \$XSILO_CEPH_DIR, default /tmp/xsilo-ceph)" >&2
    exit 2
    ;;
esac
