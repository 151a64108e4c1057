#!/bin/bash
# redis-server soak: the same redis-benchmark traffic and content checks under
# jemalloc (redis's own allocator, no preload), hakmem (LD_PRELOAD) and
# Debian's mimalloc (LD_PRELOAD, skipped with a note when not installed).
#
# Per allocator, on a free loopback port, no persistence:
#   1. redis-benchmark SET/GET (plus LPUSH/LPOP/HSET for values <= 1 KiB) with
#      values of 16 B, 64 B, 256 B, 1 KiB, 4 KiB, 16 KiB, 64 KiB, 256 KiB and
#      1 MiB, up the sizes, down again, then three sizes at once, all on one
#      bounded keyspace (-r), so values of one size overwrite another's;
#   2. keys of assorted sizes (16 B .. 1 MiB) written, read back, rewritten
#      (new sizes, APPEND growth, SETRANGE, DEL) twice and read back byte for
#      byte; every key the benchmark left read back and checked
#      (redis_verify.py);
#   3. the server checked alive (process and PING) after every phase; at the
#      end INFO memory and the process's VmHWM, then SHUTDOWN NOSAVE, which
#      must exit 0.
# hakmem's mem_fragmentation_ratio must be <= 1.2 x jemalloc's.
#
# env: SOAK_SECONDS (default 300): each allocator gets about a third of it
#      (request counts are fixed from it before the runs, so every allocator
#      serves the same requests);
#      SOAK_REDIS_ALLOCATORS (default "jemalloc hakmem mimalloc");
#      LIB (default out/release/libhakmem.so); SOAK_OUT (default out/soak);
#      SOAK_REDIS_HOOK: a bash command run at the end of each allocator's run,
#      before SHUTDOWN, with SOAK_ALLOC, SOAK_PID, SOAK_PORT, SOAK_DIR set
#      (debugging: look at the live server); its output in redis-<a>/hook.out.
# Prints PASS/FAIL lines (soak/redis-<allocator>, soak/redis-frag) and the
# tables; writes the tables to $SOAK_OUT/redis.md; exit 1 on any FAIL.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
LIB=${LIB:-$ROOT/out/release/libhakmem.so}
case $LIB in /*) ;; *) LIB=$PWD/$LIB ;; esac
SOAK_SECONDS=${SOAK_SECONDS:-300}
SOAK_OUT=${SOAK_OUT:-$ROOT/out/soak}
ALLOCATORS=${SOAK_REDIS_ALLOCATORS:-jemalloc hakmem mimalloc}
MIMALLOC=${MIMALLOC:-/usr/lib/x86_64-linux-gnu/libmimalloc.so.2}
FRAG_LIMIT=1.2

mkdir -p "$SOAK_OUT"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/hakmem-soak-redis.XXXXXX")
TPID= # the `timeout` wrapping the current server
RPID= # the server
stop_server() {
    if [ -n "$TPID" ] && kill -0 "$TPID" 2>/dev/null; then
        [ -n "$RPID" ] && kill -KILL "$RPID" 2>/dev/null
        kill -KILL "$TPID" 2>/dev/null || true
        wait "$TPID" 2>/dev/null || true
    fi
    TPID='' RPID=''
}
trap 'stop_server; rm -rf "$TMP"' EXIT

fails=0
lines=()
result() { # result PASS|FAIL|SKIP NAME [WHY]
    local l="$1 soak/$2${3:+: $3}"
    echo "$l"
    lines+=("$l")
    [ "$1" = FAIL ] && fails=$((fails + 1))
    return 0
}

for c in redis-server redis-cli redis-benchmark python3; do
    command -v "$c" >/dev/null || {
        result FAIL redis "$c not installed"
        exit 1
    }
done

# ---- the workload, fixed from SOAK_SECONDS ------------------------------------
# Cost model (measured on 2 shared cores, jemalloc): about 2 us per request
# plus 1000 bytes per us. Each allocator's benchmark phases get SOAK_SECONDS / 3
# less 15 s for start-up and the checks (at least a third of it).
PHASES=(16 64 256 1024 4096 16384 65536 262144 1048576
    262144 65536 16384 4096 1024 256 64 16 mix)
MIX_SIZES=(64 4096 262144)
DATA_CAP=$((64 << 20)) # keyspace x value size, per size
LIST_CAP=$((100 << 20)) # LPUSH requests x value size
bench_s=$((SOAK_SECONDS / 3 - 15))
[ "$bench_s" -ge $((SOAK_SECONDS / 9)) ] || bench_s=$((SOAK_SECONDS / 9))
phase_us=$((bench_s * 1000000 / ${#PHASES[@]}))
[ "$phase_us" -ge 200000 ] || phase_us=200000
phase_limit=$((phase_us * 10 / 1000000 + 60)) # seconds before a phase is a hang

tests_for() { if [ "$1" -le 1024 ]; then echo set,get,lpush,lpop,hset; else echo set,get; fi; }
ntests_for() { if [ "$1" -le 1024 ]; then echo 5; else echo 2; fi; }
requests_for() { # requests_for SIZE SHARE_PERCENT: -n for one test
    local d=$1 share=$2 n
    n=$((phase_us * share / 100 / ($(ntests_for "$d") * (2 + d / 1000))))
    [ "$n" -le 300000 ] || n=300000
    [ "$d" -gt 1024 ] || [ "$n" -le $((LIST_CAP / d)) ] || n=$((LIST_CAP / d))
    [ "$n" -ge 100 ] || n=100
    echo "$n"
}
keyspace_for() {
    local r=$((DATA_CAP / $1))
    [ "$r" -le 100000 ] || r=100000
    [ "$r" -ge 64 ] || r=64
    echo "$r"
}
bench_args() { # bench_args SIZE N: redis-benchmark arguments after -h/-p
    local d=$1 n=$2 c=50 p=16
    [ "$d" -le 4096 ] || p=4
    [ "$d" -le 65536 ] || { p=1; c=8; }
    echo "-t $(tests_for "$d") -n $n -r $(keyspace_for "$d") -d $d -c $c -P $p -q"
}
total_requests=0
for ph in "${PHASES[@]}"; do
    if [ "$ph" = mix ]; then
        for d in "${MIX_SIZES[@]}"; do
            total_requests=$((total_requests + $(requests_for "$d" 33) * $(ntests_for "$d")))
        done
    else
        total_requests=$((total_requests + $(requests_for "$ph" 100) * $(ntests_for "$ph")))
    fi
done

# ---- helpers --------------------------------------------------------------------
free_port() {
    local p
    for p in $(seq 16420 16479); do
        if [ -z "$(ss -Htln "sport = :$p" 2>/dev/null)" ] &&
            ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            echo "$p"
            return 0
        fi
    done
    return 1
}
cli() { timeout 30 redis-cli -h 127.0.0.1 -p "$PORT" "$@"; }
info_field() { # info_field FILE NAME
    tr -d '\r' <"$1" | awk -F: -v k="$2" '$1 == k { print $2; exit }'
}
status_kib() { awk -v k="$2:" '$1 == k { print $2; exit }' "/proc/$1/status" 2>/dev/null; }
mib() { awk -v b="$1" 'BEGIN { if (b == "") print "?"; else printf "%.1f MiB", b / 1048576 }'; }
alive() { # alive: the server process exists and answers PING
    [ -n "$RPID" ] && kill -0 "$RPID" 2>/dev/null && [ "$(cli ping 2>/dev/null)" = PONG ]
}
why_dead() { # sets WHY: how the server died, with its last words
    local w="server died"
    if [ -n "$TPID" ] && ! kill -0 "$TPID" 2>/dev/null; then
        local st=0
        wait "$TPID" || st=$?
        TPID=
        if [ "$st" -eq 124 ] || [ "$st" -eq 137 ]; then w="$w (timed out)"
        elif [ "$st" -gt 128 ]; then w="$w (signal $((st - 128)))"
        else w="$w (exit status $st)"; fi
    elif [ -n "$RPID" ] && kill -0 "$RPID" 2>/dev/null; then
        w="server alive but not answering PING"
    fi
    local last
    last=$(grep -h -m1 '^hakmem:' "$D"/redis.stderr "$D"/redis.log 2>/dev/null || true)
    [ -n "$last" ] || last=$(tail -n 2 "$D/redis.stderr" "$D/redis.log" 2>/dev/null | grep -v '^==>' | grep . | tail -n 1 || true)
    WHY="$w${last:+; last output: ${last:0:200}}"
}

# run_redis NAME PRELOAD: one allocator's run; sets R_* results.
run_redis() {
    local name=$1 pre=$2 t0 ph d n rc i
    D=$TMP/$name
    mkdir -p "$D"
    R_req=0 R_died=no R_keys=0 R_hwm='' R_used='' R_rss='' R_frag='' R_peak='' R_secs=''
    t0=$(date +%s)
    PORT=$(free_port) || {
        result FAIL "redis-$name" "no free port in 16420-16479"
        R_died="not started"
        return
    }
    # The whole run is bounded; each phase below has its own bound too.
    local server_limit=$((${#PHASES[@]} * phase_limit + 600))
    # shellcheck disable=SC2086
    timeout -k 5 "$server_limit" env ${pre:+LD_PRELOAD=$pre} redis-server --port "$PORT" \
        --bind 127.0.0.1 --save '' --appendonly no --daemonize no --dir "$D" \
        --logfile "$D/redis.log" >"$D/redis.stdout" 2>"$D/redis.stderr" &
    TPID=$!
    RPID=
    for _ in $(seq 1 100); do
        kill -0 "$TPID" 2>/dev/null || break
        [ "$(cli ping 2>/dev/null)" = PONG ] && break
        sleep 0.1
    done
    RPID=$(cli info server 2>/dev/null | tr -d '\r' | awk -F: '$1 == "process_id" { print $2 }') || true
    if [ -z "$RPID" ]; then
        why_dead
        R_died="yes (start)"
        result FAIL "redis-$name" "server did not start: $WHY"
        stop_server
        return
    fi
    if [ -n "$pre" ] && ! grep -qF "$(basename "$pre")" "/proc/$RPID/maps"; then
        result FAIL "redis-$name" "$pre not mapped in redis-server (preload ignored)"
        stop_server
        R_died="n/a"
        return
    fi

    local phase_no=0
    for ph in "${PHASES[@]}"; do
        phase_no=$((phase_no + 1))
        rc=0
        local p0 p1
        p0=$(date +%s%N)
        if [ "$ph" = mix ]; then
            local pids=() k=0
            for d in "${MIX_SIZES[@]}"; do
                n=$(requests_for "$d" 33)
                R_req=$((R_req + n * $(ntests_for "$d")))
                # shellcheck disable=SC2046
                timeout -k 5 "$phase_limit" redis-benchmark -h 127.0.0.1 -p "$PORT" \
                    $(bench_args "$d" "$n") >"$D/bench.$phase_no.$k.out" 2>&1 &
                pids+=($!)
                k=$((k + 1))
            done
            for i in "${pids[@]}"; do wait "$i" || rc=$?; done
        else
            n=$(requests_for "$ph" 100)
            R_req=$((R_req + n * $(ntests_for "$ph")))
            # shellcheck disable=SC2046
            timeout -k 5 "$phase_limit" redis-benchmark -h 127.0.0.1 -p "$PORT" \
                $(bench_args "$ph" "$n") >"$D/bench.$phase_no.out" 2>&1 || rc=$?
        fi
        p1=$(date +%s%N)
        if ! alive; then
            R_died="yes (phase $phase_no, $ph)"
            why_dead
            result FAIL "redis-$name" "during benchmark phase $phase_no (value size $ph): $WHY"
            stop_server
            return
        fi
        if [ "$rc" -ne 0 ]; then
            result FAIL "redis-$name" "redis-benchmark phase $phase_no (value size $ph) exit status $rc$([ "$rc" -eq 124 ] && echo ", timed out after ${phase_limit}s")"
            stop_server
            R_died="no (benchmark failed)"
            return
        fi
        sleep 0.3 # INFO's RSS is refreshed by the server's cron
        cli info memory >"$D/info.$phase_no" 2>/dev/null || true
        echo "$ph $(info_field "$D/info.$phase_no" mem_fragmentation_ratio) $(info_field "$D/info.$phase_no" used_memory_rss) $(info_field "$D/info.$phase_no" used_memory) $(((p1 - p0) / 1000000))ms" >>"$D/phases"
    done

    # Content checks.
    local vlog=$D/verify.log step out
    for step in write check churn churn check bench; do
        rc=0
        out=$(VERIFY_STATE=$D/verify.state timeout -k 5 300 python3 "$HERE/redis_verify.py" "$PORT" "$step" 2>&1) || rc=$?
        echo "$out" >>"$vlog"
        if ! alive; then
            R_died="yes (verify $step)"
            why_dead
            result FAIL "redis-$name" "during content check '$step': $WHY"
            stop_server
            return
        fi
        if [ "$rc" -ne 0 ]; then
            result FAIL "redis-$name" "content check '$step': $(tail -n 1 <<<"$out")"
            stop_server
            R_died=no
            return
        fi
    done
    # keys verified: the soak:v:* keys of the last check plus the benchmark's keys
    R_keys=$(grep -E '^verify: (check|bench) ok' "$vlog" | tail -n 2 | sed 's/.*keys=\([0-9]*\).*/\1/' | awk '{ s += $1 } END { print s + 0 }')

    sleep 1
    cli info memory >"$D/info.final" 2>/dev/null || true
    R_used=$(info_field "$D/info.final" used_memory)
    R_rss=$(info_field "$D/info.final" used_memory_rss)
    R_frag=$(info_field "$D/info.final" mem_fragmentation_ratio)
    R_peak=$(info_field "$D/info.final" used_memory_peak)
    R_hwm=$(status_kib "$RPID" VmHWM)
    R_hwm=${R_hwm:+$((R_hwm * 1024))}
    cat "/proc/$RPID/smaps" >"$D/smaps.final" 2>/dev/null || true # where the RSS is, for diagnosis
    if [ -n "${SOAK_REDIS_HOOK:-}" ]; then # debugging aid: look at the live server
        SOAK_ALLOC=$name SOAK_PID=$RPID SOAK_PORT=$PORT SOAK_DIR=$D \
            timeout -k 5 600 bash -c "$SOAK_REDIS_HOOK" >"$D/hook.out" 2>&1 || true
    fi
    cli shutdown nosave >/dev/null 2>&1 || true
    local st=0
    wait "$TPID" || st=$?
    TPID='' RPID=''
    R_secs=$(($(date +%s) - t0))
    if [ "$st" -ne 0 ]; then
        R_died="yes (at shutdown, status $st)"
        result FAIL "redis-$name" "SHUTDOWN NOSAVE: exit status $st"
        return
    fi
    if grep -q '^hakmem:' "$D/redis.stderr" "$D/redis.stdout" "$D/redis.log" 2>/dev/null; then
        result FAIL "redis-$name" "hakmem diagnostic: $(grep -h -m1 '^hakmem:' "$D/redis.stderr" "$D/redis.stdout" "$D/redis.log")"
        return
    fi
    if [ -z "$R_frag" ]; then
        result FAIL "redis-$name" "no mem_fragmentation_ratio in INFO memory"
        return
    fi
    result PASS "redis-$name"
}

# ---- runs ---------------------------------------------------------------------------
echo "soak/redis: SOAK_SECONDS=$SOAK_SECONDS, ${#PHASES[@]} benchmark phases of ~$((phase_us / 1000)) ms planned each (bound ${phase_limit} s), $total_requests requests per allocator"
declare -A REQ HWM USED RSS FRAG PEAK KEYS DIED SECS
ran=()
for a in $ALLOCATORS; do
    pre=
    case $a in
    jemalloc) ;;
    hakmem)
        if [ ! -f "$LIB" ]; then
            result FAIL redis-hakmem "library $LIB not found (run make release)"
            continue
        fi
        pre=$LIB
        ;;
    mimalloc)
        if [ ! -r "$MIMALLOC" ]; then
            result SKIP redis-mimalloc "$MIMALLOC not installed (apt-get install libmimalloc2.0)"
            continue
        fi
        pre=$MIMALLOC
        ;;
    *)
        echo "soak/redis: unknown allocator $a" >&2
        exit 2
        ;;
    esac
    echo "soak/redis: $a${pre:+ (LD_PRELOAD=$pre)} ..."
    run_redis "$a" "$pre"
    ran+=("$a")
    REQ[$a]=$R_req HWM[$a]=$R_hwm USED[$a]=$R_used RSS[$a]=$R_rss FRAG[$a]=$R_frag
    PEAK[$a]=$R_peak KEYS[$a]=$R_keys DIED[$a]=$R_died SECS[$a]=$R_secs
    mkdir -p "$SOAK_OUT/redis-$a"
    cp "$D"/redis.log "$D"/redis.stderr "$D"/verify.log "$D"/phases "$D"/info.final "$D"/smaps.final "$D"/hook.out \
        "$SOAK_OUT/redis-$a/" 2>/dev/null || true
done

# ---- fragmentation against jemalloc ------------------------------------------------
if [ -n "${FRAG[hakmem]:-}" ] && [ -n "${FRAG[jemalloc]:-}" ]; then
    if awk -v h="${FRAG[hakmem]}" -v j="${FRAG[jemalloc]}" -v l="$FRAG_LIMIT" 'BEGIN { exit !(h <= l * j) }'; then
        result PASS redis-frag
    else
        result FAIL redis-frag "hakmem mem_fragmentation_ratio ${FRAG[hakmem]} > $FRAG_LIMIT x jemalloc's ${FRAG[jemalloc]}"
    fi
elif [[ " $ALLOCATORS " == *" hakmem "* && " $ALLOCATORS " == *" jemalloc "* ]]; then
    result FAIL redis-frag "no fragmentation figure for hakmem or jemalloc (see above)"
fi

# ---- tables -----------------------------------------------------------------------------
{
    echo "### redis-server soak (SOAK_SECONDS=$SOAK_SECONDS, redis $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/'))"
    echo
    echo "Same redis-benchmark requests for each allocator (values 16 B .. 1 MiB, bounded keyspaces), then content checks. Fragmentation = used_memory_rss / used_memory at the end (redis's mem_fragmentation_ratio); pass: hakmem <= $FRAG_LIMIT x jemalloc."
    echo
    echo "| allocator | requests | peak RSS (VmHWM) | used_memory | used_memory_rss | mem_fragmentation_ratio | used_memory_peak | keys verified | server died? | seconds |"
    echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |"
    for a in "${ran[@]}"; do
        echo "| $a | ${REQ[$a]} | $(mib "${HWM[$a]}") | $(mib "${USED[$a]}") | $(mib "${RSS[$a]}") | ${FRAG[$a]:-?} | $(mib "${PEAK[$a]}") | ${KEYS[$a]:-0} | ${DIED[$a]} | ${SECS[$a]:-?} |"
    done
    echo
    echo "mem_fragmentation_ratio after each benchmark phase (value size; mix = 64 B, 4 KiB and 256 KiB at once):"
    echo
    printf '| phase | value size |'
    for a in "${ran[@]}"; do printf ' %s |' "$a"; done
    echo
    printf '| ---: | ---: |'
    for a in "${ran[@]}"; do printf ' ---: |'; done
    echo
    for i in $(seq 1 ${#PHASES[@]}); do
        printf '| %d | %s |' "$i" "${PHASES[$((i - 1))]}"
        for a in "${ran[@]}"; do
            f=$(sed -n "${i}p" "$TMP/$a/phases" 2>/dev/null | awk '{ printf "%s (%.0f MiB rss)", $2, $3 / 1048576 }')
            printf ' %s |' "${f:-n/a}"
        done
        echo
    done
} >"$SOAK_OUT/redis.md"
echo
cat "$SOAK_OUT/redis.md"
[ "$fails" -eq 0 ]
