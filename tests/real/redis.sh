#!/bin/bash
# redis-server running on hakmem (LD_PRELOAD) on a loopback port: survives
# redis-benchmark, stores and returns keys and a 1 MB value intact, and exits
# with status 0 on SHUTDOWN NOSAVE.
set -euo pipefail
NAME=redis
# shellcheck source=tests/real/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

for c in redis-server redis-cli redis-benchmark; do
    command -v "$c" >/dev/null || fail "$c not installed"
done
require_lib

# A loopback port nobody listens on.
PORT=
for p in $(seq 16379 16399); do
    # Free: nothing listed as listening, and a connection attempt is refused.
    if [ -z "$(ss -Htln "sport = :$p" 2>/dev/null)" ] &&
        ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
        PORT=$p
        break
    fi
done
[ -n "$PORT" ] || fail "no free port in 16379-16399"
cli() { timeout "$(scaled_limit 60)" redis-cli -h 127.0.0.1 -p "$PORT" "$@"; }
# Waits for a server to come up or go: a hang only past this.
WAIT=$(scaled_limit 60)

PID=
kill_server() {
    if [ -n "$PID" ] && kill -0 "$PID" 2>/dev/null; then
        kill -KILL "$PID" 2>/dev/null || true
        wait "$PID" 2>/dev/null || true
    fi
}
cleanup_hooks+=(kill_server)

LD_PRELOAD=$LIB redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no \
    --daemonize no --dir "$TMP" --logfile "$TMP/redis.log" >"$TMP/redis.stdout" 2>&1 &
PID=$!

up=
t0=$SECONDS
while [ $((SECONDS - t0)) -lt "$WAIT" ]; do
    kill -0 "$PID" 2>/dev/null || break
    if [ "$(cli ping 2>/dev/null)" = PONG ]; then
        up=1
        break
    fi
    sleep 0.1
done
[ -n "$up" ] || fail "server did not answer PING: $(tail -n 2 "$TMP/redis.log" 2>/dev/null | tr '\n' ' ')"
grep -q libhakmem "/proc/$PID/maps" || fail "libhakmem not mapped in redis-server"

# Every command of redis-benchmark's default set 50000 times from 50 clients
# (without -r they all work on the same few keys: a list of 50000 elements is
# the biggest; 100000 took twice as long and made nothing bigger but it).
rc=0
timeout "$(scaled_limit 900)" redis-benchmark -h 127.0.0.1 -p "$PORT" -n 50000 -q >"$TMP/bench.out" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || fail "redis-benchmark: $(describe_rc "$rc")"
n=$(tr '\r' '\n' <"$TMP/bench.out" | grep -c 'requests per second') || true
[ "$n" -ge 10 ] || fail "redis-benchmark printed only $n results"
kill -0 "$PID" 2>/dev/null || fail "server died during the benchmark"

# Keys written and read back, including a 1 MB value and growing strings.
val() { printf 'value-%d-%s' "$1" "$(head -c "$(($1 * 40))" /dev/zero | tr '\0' x)"; }
for i in $(seq 1 50); do
    [ "$(cli set "key:$i" "$(val "$i")")" = OK ] || fail "SET key:$i"
done
for i in 1 17 50; do
    [ "$(cli --raw get "key:$i")" = "$(val "$i")" ] || fail "GET key:$i returned wrong data"
done
[ "$(cli mget key:3 key:4 | tr '\n' ' ')" = "$(val 3) $(val 4) " ] || fail "MGET"
head -c 786432 /dev/urandom | base64 -w 0 >"$TMP/big.val" # exactly 1 MiB of text
[ "$(cli -x set big <"$TMP/big.val")" = OK ] || fail "SET of 1 MB value"
[ "$(cli strlen big)" = 1048576 ] || fail "STRLEN big is not 1048576"
cli --raw get big >"$TMP/big.got" # value plus a newline
[ "$(stat -c %s "$TMP/big.got")" -eq 1048577 ] || fail "GET big returned the wrong length"
cmp -s -n 1048576 "$TMP/big.val" "$TMP/big.got" || fail "1 MB value came back different"
for i in $(seq 1 20); do cli append grow "$(head -c 50000 "$TMP/big.val")" >/dev/null; done
[ "$(cli strlen grow)" = 1000000 ] || fail "APPEND x20 did not give 1000000 bytes"
[ "$(cli del big grow)" = 2 ] || fail "DEL big grow"
[ "$(cli dbsize)" -ge 50 ] || fail "DBSIZE too small"

# Clean shutdown: the server must exit 0, not die from a signal.
cli shutdown nosave >/dev/null 2>&1 || true
t0=$SECONDS
while [ $((SECONDS - t0)) -lt "$WAIT" ]; do
    kill -0 "$PID" 2>/dev/null || break
    sleep 0.1
done
kill -0 "$PID" 2>/dev/null && fail "server still running $WAIT s after SHUTDOWN NOSAVE"
st=0
wait "$PID" || st=$?
PID=
[ "$st" -eq 0 ] || fail "server exited with $(describe_rc "$st")"
check_no_diag "$TMP/redis.log"
pass
