#!/usr/bin/env bash
# The heap profiler as a user runs it: HAKMEM_PROF=1, then google-pprof
# (Debian's google-perftools) on the profile written at exit.
#  - tests/prof/prof_prog.c holds known live bytes in four functions (malloc,
#    calloc, aligned_alloc, and a Large malloc in a thread; part of what each
#    allocated freed): `google-pprof --text` must rank them as their true
#    live bytes rank and give each within 20% of them;
#  - hak_prof_dump(path) writes the same at any time; --collapsed and --svg
#    read it;
#  - HAKMEM_PROF_FILE's %p is the pid, and a forked child writes its own;
#  - sampling every allocation (HAKMEM_PROF_SAMPLE=1) runs real programs
#    (a shell, python3, a threaded test) to the end: the unwinder's own
#    allocations are not sampled, nothing deadlocks;
#  - a preloaded write() that allocates does not deadlock a dump;
#  - with HAKMEM_PROF unset no profile is written and hak_prof_dump says
#    EINVAL.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=tests/lib.sh
source tests/lib.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL check_prof: $*"; exit 1; }
lib=$PWD/out/release/libhakmem.so
[ -r "$lib" ] || fail "no $lib (make release)"
command -v google-pprof >/dev/null || fail "google-pprof missing (tests/deps.sh installs google-perftools)"

cc -O1 -g -pthread tests/prof/prof_prog.c -o "$tmp/prog" -ldl || fail "cannot build prof_prog"
cd "$tmp"

# 1. Exit profile: ranks and sizes. A 16 KiB mean gap gives each function
# hundreds of samples: a 20% error is over 4 standard deviations.
HAKMEM_PROF=1 HAKMEM_PROF_SAMPLE=16384 HAKMEM_PROF_FILE="$tmp/exit.%p.heap" LD_PRELOAD=$lib \
  ./prog "$tmp/dump.heap" >truth.txt || fail "prof_prog failed"
profs=("$tmp"/exit.*.heap)
[ ${#profs[@]} -eq 1 ] && [ -s "${profs[0]}" ] || fail "no profile at exit (${profs[*]})"
pid=${profs[0]##*/exit.}
pid=${pid%.heap}
[[ $pid =~ ^[0-9]+$ ]] || fail "%p not replaced by a pid: ${profs[0]}"
for prof in "${profs[0]}" "$tmp/dump.heap"; do
  google-pprof --text --inuse_space ./prog "$prof" >text.txt 2>pprof.err || {
    cat pprof.err
    fail "google-pprof --text failed on $prof"
  }
  python3 - truth.txt text.txt "$prof" <<'PY' || fail "profile $prof does not match (above)"
import sys
truth = {l.split()[0]: int(l.split()[1]) / 2**20 for l in open(sys.argv[1])}
flat = {}
for line in open(sys.argv[2]):
    f = line.split()
    if len(f) == 6 and f[5] in truth:
        flat[f[5]] = float(f[0])  # flat MB (MiB) in use
ok = True
for name, mib in sorted(truth.items(), key=lambda kv: -kv[1]):
    got = flat.get(name)
    err = None if got is None else (got - mib) / mib
    print(f"  {name:16} true {mib:7.2f} MiB  pprof {got} MiB  error {err if err is None else f'{err:+.1%}'}")
    if got is None or abs(err) > 0.20:
        ok = False
if sorted(truth, key=truth.get) != sorted(flat, key=flat.get):
    print("  ranked wrong:", sorted(flat, key=flat.get, reverse=True))
    ok = False
sys.exit(0 if ok else 1)
PY
done
google-pprof --collapsed ./prog "$tmp/dump.heap" >collapsed.txt 2>/dev/null || fail "--collapsed failed"
grep -Eq ';aligned_blocks[< ]' collapsed.txt || fail "--collapsed has no aligned_blocks stack"
google-pprof --svg ./prog "$tmp/dump.heap" >graph.svg 2>/dev/null || fail "--svg failed"
grep -q '<svg' graph.svg && grep -q 'aligned_blocks' graph.svg || fail "--svg made no graph"

# 2. A forked child writes a profile of its own.
cat >fork.c <<'C'
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
int main(void) {
    void *p = malloc(1 << 20);
    if (fork() == 0) { /* _exit: no destructor, no profile */
        free(malloc(1 << 20));
        _exit(0);
    }
    if (fork() == 0) return malloc(1 << 21) == NULL; /* a child that exits: its own profile */
    while (wait(NULL) > 0) {
    }
    free(p);
    return 0;
}
C
cc -O1 fork.c -o fork
mkdir forks
HAKMEM_PROF=1 HAKMEM_PROF_FILE="$tmp/forks/%p.heap" LD_PRELOAD=$lib ./fork || fail "fork program failed"
n=$(find forks -name '*.heap' | wc -l)
[ "$n" -eq 2 ] || fail "expected 2 profiles (parent, exiting child), got $n"

# 3. Every allocation sampled: realloc of sampled blocks keeps their bytes
# as they grow and shrink through every tier, and real programs still run to
# their end.
cat >grow.c <<'C'
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static void check(const unsigned char *p, size_t n, unsigned char seed) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != (unsigned char)(seed + i * 7)) {
            fprintf(stderr, "byte %zu of %zu lost\n", i, n);
            exit(1);
        }
}
int main(void) {
    static const size_t sizes[] = {16, 40, 100, 1000, 3000, 20000, 70000, 300000, 1 << 20,
                                   3 << 20, 500000, 5000, 64, 24, 2 << 20, 8};
    for (int round = 0; round < 50; round++) {
        unsigned char seed = (unsigned char)round;
        unsigned char *p = NULL;
        size_t had = 0;
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            size_t n = sizes[(k + round) % (sizeof sizes / sizeof sizes[0])];
            p = realloc(p, n);
            if (p == NULL || malloc_usable_size(p) < n) return 1;
            check(p, had < n ? had : n, seed);
            for (size_t i = 0; i < n; i++)
                p[i] = (unsigned char)(seed + i * 7);
            had = n;
        }
        free(p);
    }
    return 0;
}
C
cc -O1 grow.c -o grow
LD_PRELOAD=$lib HAKMEM_PROF=1 HAKMEM_PROF_SAMPLE=1 HAKMEM_PROF_FILE="$tmp/grow.heap" ./grow \
  || fail "realloc of sampled blocks lost bytes or failed"
head -1 grow.heap | grep -q '^heap profile: *0: *0 ' || fail "freed samples left in the profile: $(head -1 grow.heap)"
# Many sampled small blocks in use at once: each is a mapping, and past the
# kernel's limit on their count every mmap failed (python3 with a sample per
# KiB raised MemoryError). Past hakmem's own bound the samples are not taken,
# the program runs on, and the exit says the profile undercounts.
cat >many.c <<'C'
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#define N 100000
static void *keep[N];
int main(void) {
    for (int i = 0; i < N; i++) {
        if ((keep[i] = malloc(48)) == NULL) {
            fprintf(stderr, "malloc %d of %d failed\n", i, N);
            return 1;
        }
        memset(keep[i], i, 48);
    }
    /* A mapping of the program's own still comes. */
    void *m = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    munmap(m, 1 << 20);
    for (int i = 0; i < N; i++)
        free(keep[i]);
    return 0;
}
C
cc -O1 many.c -o many
LD_PRELOAD=$lib HAKMEM_PROF=1 HAKMEM_PROF_SAMPLE=1 HAKMEM_PROF_FILE="$tmp/many.heap" ./many 2>many.err \
  || fail "sampling 100000 small blocks in use made malloc fail: $(cat many.err)"
grep -q '^hakmem: heap profile: [0-9]* sampled allocations were not recorded' many.err \
  || fail "no line on the samples not taken: $(cat many.err)"
# A library loaded with the program whose constructor waits for a thread of
# its own that asks the loader something: the profiler's start (in hakmem's
# constructor) must not run that constructor inside its own under the
# loader's lock (a dlopen there hung this).
cat >ctor.c <<'C'
#define _GNU_SOURCE
#include <execinfo.h>
#include <link.h>
#include <pthread.h>
#include <stdlib.h>
static int count(struct dl_phdr_info *i, size_t s, void *a) {
    (void)i;
    (void)s;
    ++*(int *)a;
    return 0;
}
static void *worker(void *a) {
    void *pc[8];
    backtrace(pc, 8);
    dl_iterate_phdr(count, a);
    free(malloc(100));
    return NULL;
}
__attribute__((constructor)) static void start(void) {
    pthread_t t;
    int n = 0;
    if (pthread_create(&t, NULL, worker, &n) != 0 || pthread_join(t, NULL) != 0 || n == 0) abort();
}
C
cc -O1 -shared -fPIC ctor.c -o libctor.so -pthread
cat >plain.c <<'C'
#include <stdlib.h>
int main(void) {
    free(malloc(10));
    return 0;
}
C
cc -O1 plain.c -o plain
for order in "$tmp/libctor.so $lib" "$lib $tmp/libctor.so"; do
  rc=0
  timeout -k 5 "$(scaled_limit 120)" env LD_PRELOAD="$order" HAKMEM_PROF=1 HAKMEM_PROF_FILE=/dev/null ./plain || rc=$?
  [ $rc -eq 0 ] || fail "a library's constructor waiting for its thread, LD_PRELOAD='$order': exit $rc (124: hung)"
done
# A preloaded wrapper of write() that allocates (a tracing shim): the dump
# writes its file with no lock held, so the wrapper's allocations, sampled,
# do not wait for a lock the dump holds (it deadlocked on itself).
cat >wrapwrite.c <<'C'
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
ssize_t write(int fd, const void *buf, size_t n) {
    char *copy = malloc(n + 1);
    if (copy != NULL) memcpy(copy, buf, n < 64 ? n : 64);
    free(copy);
    return syscall(SYS_write, fd, buf, n);
}
C
cat >dumpfew.c <<'C'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    int (*dump)(const char *) = (int (*)(const char *))dlsym(RTLD_DEFAULT, "hak_prof_dump");
    static void *v[5000]; /* (well under the bound on sampled small blocks) */
    for (int i = 0; i < 5000; i++)
        v[i] = malloc(100);
    int rc = argc > 1 && dump != NULL ? dump(argv[1]) : -1;
    for (int i = 0; i < 5000; i++)
        free(v[i]);
    return rc != 0;
}
C
cc -O1 -fno-builtin -shared -fPIC wrapwrite.c -o libwrapwrite.so  # (-fno-builtin: its malloc stays)
cc -O1 dumpfew.c -o dumpfew -ldl
rc=0
timeout -k 5 "$(scaled_limit 300)" env LD_PRELOAD="$lib $tmp/libwrapwrite.so" HAKMEM_PROF=1 HAKMEM_PROF_SAMPLE=1 \
  HAKMEM_PROF_FILE=/dev/null ./dumpfew "$tmp/wrapped.heap" >/dev/null || rc=$?
[ $rc -eq 0 ] || fail "hak_prof_dump with a preloaded write() that allocates: exit $rc (124: hung)"
[ -s wrapped.heap ] || fail "no profile written through the wrapped write()"
export HAKMEM_PROF=1 HAKMEM_PROF_SAMPLE=1 HAKMEM_PROF_FILE="$tmp/all.%p.heap"
LD_PRELOAD=$lib sh -c 'for i in 1 2 3; do echo $i; done | sort -r >/dev/null' || fail "sh failed sampling all"
LD_PRELOAD=$lib python3 -c 'import json; json.dumps([{"a": str(i)} for i in range(20000)])' \
  || fail "python3 failed sampling all"
LD_PRELOAD=$lib timeout "$(scaled_limit 1200)" "$OLDPWD/out/tests/test_threads" >threads.log 2>&1 || {
  tail threads.log
  fail "test_threads failed sampling all"
}
unset HAKMEM_PROF HAKMEM_PROF_SAMPLE HAKMEM_PROF_FILE

# 4. Off: nothing written, and hak_prof_dump says EINVAL.
mkdir off
(cd off && LD_PRELOAD=$lib ../prog "$tmp/off/x.heap" >/dev/null 2>err.txt) && fail "hak_prof_dump succeeded with the profiler off"
grep -q 'Invalid argument' off/err.txt || fail "hak_prof_dump off: $(cat off/err.txt)"
[ -z "$(find off -name '*.heap')" ] || fail "a profile was written with the profiler off"
echo "PASS check_prof"
