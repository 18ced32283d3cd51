#!/bin/bash
cd /work/main
X=build/tools/xsilo/xsilo
O=${1:-results/e2e-idle-cache}  # this run: /tmp/bc/ab, then copied here
mkdir -p $O
for i in 1 2; do
for tag in off on; do
  case $tag in off) export XSILO_BUFFER_CACHE_BYTES=0;; on) unset XSILO_BUFFER_CACHE_BYTES;; esac
  echo "== geo $tag-$i $(date +%T)"
  XSILO_DEBUG=1 perf stat -a -e page-faults,task-clock -o $O/geo-$tag-$i.perfstat -- $X bench e2e --env geo-distributed --scale 0.1 --backends auto+s3,auto+s3~int8 --tiers big --rounds 3 --local-steps 1 --out $O/geo-$tag-$i > $O/geo-$tag-$i.log 2>&1
  grep -E "job .* over" $O/geo-$tag-$i.log
done
done
for i in 1 2; do
for tag in off on; do
  case $tag in off) export XSILO_BUFFER_CACHE_BYTES=0;; on) unset XSILO_BUFFER_CACHE_BYTES;; esac
  echo "== lan $tag-$i $(date +%T)"
  perf stat -a -e page-faults,task-clock -o $O/lan-$tag-$i.perfstat -- $X bench e2e --env lan --tiers big --clients 3 --rounds 4 --local-steps 1 --backends auto+s3~int8 --out $O/lan-$tag-$i > $O/lan-$tag-$i.log 2>&1
  grep -E "job .* over" $O/lan-$tag-$i.log
done
done
echo ALL-DONE $(date +%T)
