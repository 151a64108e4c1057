#!/usr/bin/env bash
# Real programs under each allocator: time, peak RSS and page faults.
#
# usage: bench/real.sh            (from the repo root; `make bench-real` calls it)
# env:   RUNS=5                   runs per (program, allocator), interleaved
#        ALLOCATORS="glibc hakmem mimalloc jemalloc"
#        BENCH_EXTRA="NAME=PATH ..."  more allocators (as bench/run.sh)
#        HAKMEM_SO=path           hakmem library (default out/release/libhakmem.so)
#
# Programs (each given a fresh copy of its input every run):
#   git_gc      `git gc --aggressive` on a clone of this repository with 18 MB
#               of headers and sources added in four revisions (git's delta
#               search churns mid-size buffers)
#   gcc         `gcc -O2 -g -c` of three files of core/ in turn (cc1)
#   python      CPython building, serialising and parsing a JSON document of
#               200,000 records, and growing lists and strings
# Medians over the runs of elapsed seconds (`/usr/bin/time %e`), peak RSS
# (`%M`, KiB; for gcc the largest process, cc1) and minor page faults (`%R`);
# the table goes to stdout and out/bench/real.md.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
unset LD_PRELOAD
ROOT=$PWD
OUT=$ROOT/out/bench/real
RUNS=${RUNS:-5}
ALLOCATORS=${ALLOCATORS:-glibc hakmem mimalloc jemalloc}
HAKMEM_SO=${HAKMEM_SO:-$ROOT/out/release/libhakmem.so}
# shellcheck source=bench/lib.sh
source bench/lib.sh

for t in git gcc python3 /usr/bin/time; do
    command -v "$t" >/dev/null || {
        echo "bench/real.sh: $t not found (run bench/deps.sh)" >&2
        exit 2
    }
done

declare -A SO=()
pick_allocators bench/real.sh

rm -rf "$OUT"
mkdir -p "$OUT"
# A repository for git gc: this one's history and, to give the delta search
# something to chew on, 18 MB of C headers and Python sources in four
# revisions (a quarter of the files changed in each).
git clone -q --no-local "$ROOT" "$OUT/repo.src"
(
    cd "$OUT/repo.src"
    mkdir -p data
    cp -r /usr/include/linux /usr/include/x86_64-linux-gnu data/ 2>/dev/null || true
    cp /usr/lib/python3*/*.py data/ 2>/dev/null || true
    git add -A data
    git -c user.name=bench -c user.email=bench@localhost commit -qm r0
    for r in 1 2 3; do
        find data -name '*.py' -o -name '*.h' | sort | awk -v r=$r 'NR % 4 == r % 4' |
            xargs sed -i "1a /* rev $r */"
        git add -A data
        git -c user.name=bench -c user.email=bench@localhost commit -qm "r$r"
    done
)
cat >"$OUT/work.py" <<'EOF'
import json
recs = [{"id": i, "name": "item%d" % i, "tags": ["t%d" % (i % 7)] * (i % 5),
         "score": i * 0.5, "text": "x" * (i % 300)} for i in range(200000)]
doc = json.dumps(recs)
back = json.loads(doc)
assert back[12345]["id"] == 12345
parts = []
for r in back:
    parts.append(r["name"] * 3)
s = "".join(parts)
lists = [[j for j in range(i % 1000)] for i in range(3000)]
print(len(doc), len(s), sum(len(l) for l in lists))
EOF

# run PROGRAM ALLOCATOR RUN: one measured run; appends "prog alloc secs rss faults".
run() {
    local prog=$1 a=$2 r=$3 so=${SO[$2]} d=$OUT/$1.$2.$3
    local -a env=()
    [ -n "$so" ] && env=(LD_PRELOAD="$so")
    env+=($(allocator_env "$a"))
    rm -rf "$d"
    mkdir -p "$d"
    case $prog in
    git_gc)
        cp -r "$OUT/repo.src" "$d/repo"
        (cd "$d/repo" && env "${env[@]}" /usr/bin/time -o "$d/time" -f '%e %M %R' \
            git gc -q --aggressive)
        ;;
    gcc)
        env "${env[@]}" /usr/bin/time -o "$d/time" -f '%e %M %R' sh -c \
            "for f in core/l25/*.c core/large/cache.c core/front/api.c; do
                 gcc -std=c11 -D_GNU_SOURCE -O2 -g -Iinclude -Icore -c \$f -o $d/o.o || exit 1
             done"
        ;;
    python)
        env "${env[@]}" /usr/bin/time -o "$d/time" -f '%e %M %R' python3 "$OUT/work.py" >"$d/out"
        ;;
    esac
    echo "$prog $a $(tail -1 "$d/time")" >>"$OUT/results.txt"
    rm -rf "$d"
}

progs=(git_gc gcc python)
n=${#allocs[@]}
for ((r = 1; r <= RUNS; r++)); do
    for p in "${progs[@]}"; do
        for ((k = 0; k < n; k++)); do
            run "$p" "${allocs[$(((r - 1 + k) % n))]}" "$r"
        done
    done
    echo "bench/real.sh: run $r/$RUNS done" >&2
done

python3 - "$OUT/results.txt" "${allocs[@]}" <<'EOF' | tee "$OUT/../real.md"
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
allocs = sys.argv[2:]
progs = list(dict.fromkeys(r[0] for r in rows))
med = {}
for p in progs:
    for a in allocs:
        rs = [r for r in rows if r[0] == p and r[1] == a]
        med[p, a] = [statistics.median(float(r[i]) for r in rs) for i in (2, 3, 4)]
print("| program | allocator | seconds | peak RSS KiB | minor faults | time vs glibc | RSS vs jemalloc |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
for p in progs:
    for a in allocs:
        s, m, f = med[p, a]
        g = med.get((p, "glibc"))
        j = med.get((p, "jemalloc"))
        print(f"| {p} | {a} | {s:.2f} | {m:.0f} | {f:.0f} | "
              f"{s / g[0] if g and g[0] else float('nan'):.2f} | "
              f"{m / j[1] if j else float('nan'):.2f} |")
EOF
