#!/usr/bin/env bash
# 16-core side-by-side (issue 33): Oncelog vs Electric 0.1.5, one round, servers alternating.
set -u
root=$(pwd)
mkdir -p /tmp/peers-cache/electric/bin
cp devbin/cache/electric/bin/durable-streams-server /tmp/peers-cache/electric/bin/
chmod +x /tmp/peers-cache/electric/bin/durable-streams-server devbin/release/* 
ulimit -n "$(ulimit -Hn)" || true
{ echo "nproc $(nproc)"; lscpu | grep -E 'Model name|^CPU\(s\)'; free -g | head -2; df -h /tmp | tail -1; ulimit -n; uname -r; } > "$OUT/machine.txt" 2>&1
export CARGO_TARGET_DIR=$root/devbin ONCELOG_PEERS_CACHE=/tmp/peers-cache TMPDIR=/tmp
timeout --signal=INT 520 scripts/bench-peers --servers oncelog,electric --scenarios s1,sse1000,sse5000,catchup1m \
    --rounds 1 --duration 10 --catchup-mb 200 --no-build --out "$OUT/peers16.md" > "$OUT/bench-peers.log" 2>&1
echo "bench-peers rc=$?" >> "$OUT/bench-peers.log"
# The generators' summaries and the servers' stderr tails, small.
for f in /tmp/peers-cache/runs/*/*; do
    case "$f" in *.out | *.err) tail -c 4000 "$f" > "$OUT/$(basename "$f")" ;; esac
done 2>/dev/null
ls "$OUT" | head -50
