/* The counting runtime of the `count` build (make count): what each call
 * site of the allocator costs a many-core machine, measured on any machine.
 *
 * The library is compiled with -fsanitize=thread, which makes the compiler
 * call a hook before every memory access and for every atomic operation,
 * and linked with this file instead of ThreadSanitizer's runtime. The hooks
 * do the access (atomics) and count, per call site (the hook's return
 * address):
 *   rmw    atomic read-modify-writes (exchange, fetch_*, compare-exchange);
 *   lock   locks taken (hak_lock and the spin locks call hak_count_lock,
 *          which takes a mutex's word as written);
 *   swrite writes to a cache line another thread holds a copy of (an
 *          invalidation: what a shared counter or a lock word costs);
 *   sread  reads of a line another thread wrote since this thread last had
 *          it (a coherence miss: what false sharing costs the reader).
 * Line ownership is simulated with a table of the lines the allocator
 * touched: for each, the set of threads holding a copy (a bit per thread,
 * modulo 64) and the last writer. Caches are taken as infinite, so only
 * sharing misses count. The program's own accesses (uninstrumented) are not
 * seen; the allocator's writes into blocks (free-list links) are.
 *
 * bench/bench_threads.c finds the entry points below with dlsym: it counts
 * its measured phase only (hak_count_begin .. hak_count_end) and prints the
 * totals and the sites per operation (hak_count_print); tests/scale/run.sh
 * names the sites (addr2line) and holds them to budgets.
 *
 * Nothing here allocates: tables are mapped once, with mmap. */
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
#define HIDDEN __attribute__((visibility("hidden")))

enum { K_RMW, K_LOCK, K_SWRITE, K_SREAD, NKIND };
static const char *const kind_name[NKIND] = {"rmw", "lock", "swrite", "sread"};

static _Atomic bool count_on;
static _Atomic uint32_t count_threads;
static __thread uint32_t count_tid; /* 1, 2, ...; 0: not yet numbered */

/* ---- call sites ------------------------------------------------------------ */

#define NSITES 8192
struct site {
    _Atomic uintptr_t pc;
    _Atomic uint64_t n[NKIND];
};
static struct site sites[NSITES];
static _Atomic uint64_t sites_lost; /* events of sites that found the table full */

static void count(const void *pc, int kind) {
    uintptr_t key = (uintptr_t)pc;
    uint32_t i = (uint32_t)((key * 0x9e3779b97f4a7c15ull) >> 51) & (NSITES - 1);
    for (uint32_t probe = 0; probe < NSITES; probe++, i = (i + 1) & (NSITES - 1)) {
        uintptr_t cur = atomic_load_explicit(&sites[i].pc, memory_order_relaxed);
        if (cur == 0) {
            uintptr_t zero = 0;
            if (!atomic_compare_exchange_strong(&sites[i].pc, &zero, key) && zero != key) continue;
            cur = key;
        }
        if (cur == key) {
            atomic_fetch_add_explicit(&sites[i].n[kind], 1, memory_order_relaxed);
            return;
        }
    }
    atomic_fetch_add_explicit(&sites_lost, 1, memory_order_relaxed);
}

/* ---- cache lines ------------------------------------------------------------- */

#define NLINES     ((size_t)1 << 22)
#define LINE_PROBE 64
struct line {
    _Atomic uintptr_t key; /* address >> 6, + 1 (0: free) */
    _Atomic uint64_t holders;
    _Atomic uint32_t writer; /* count_tid of the last writer, 0: none */
};
static struct line *_Atomic lines;
static _Atomic uint64_t lines_full; /* accesses to lines the table had no room for */

static struct line *line_table(void) {
    struct line *t = atomic_load_explicit(&lines, memory_order_acquire);
    if (t) return t;
    void *m = mmap(NULL, NLINES * sizeof *t, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
        static const char msg[] = "hakmem count: cannot map the line table\n";
        (void)!write(2, msg, sizeof msg - 1);
        _exit(3);
    }
    struct line *none = NULL;
    if (atomic_compare_exchange_strong(&lines, &none, (struct line *)m)) return m;
    munmap(m, NLINES * sizeof *t);
    return none;
}

static struct line *line_of(uintptr_t addr) {
    struct line *t = line_table();
    uintptr_t key = (addr >> 6) + 1;
    size_t i = (size_t)((key * 0x9e3779b97f4a7c15ull) >> 40) & (NLINES - 1);
    for (uint32_t probe = 0; probe < LINE_PROBE; probe++, i = (i + 1) & (NLINES - 1)) {
        uintptr_t cur = atomic_load_explicit(&t[i].key, memory_order_relaxed);
        if (cur == key) return &t[i];
        if (cur == 0) {
            uintptr_t zero = 0;
            if (atomic_compare_exchange_strong(&t[i].key, &zero, key) || zero == key) return &t[i];
        }
    }
    atomic_fetch_add_explicit(&lines_full, 1, memory_order_relaxed);
    return NULL;
}

static uint32_t tid(void) {
    if (count_tid == 0) count_tid = atomic_fetch_add(&count_threads, 1) + 1;
    return count_tid;
}

static void access_line(uintptr_t addr, bool write, const void *pc) {
    struct line *l = line_of(addr);
    if (l == NULL) return;
    uint32_t me = tid();
    uint64_t bit = 1ull << (me & 63);
    uint64_t h = atomic_load_explicit(&l->holders, memory_order_relaxed);
    bool on = atomic_load_explicit(&count_on, memory_order_relaxed);
    if (write) {
        if ((h & ~bit) && on) count(pc, K_SWRITE);
        if (h != bit) atomic_store_explicit(&l->holders, bit, memory_order_relaxed);
        if (atomic_load_explicit(&l->writer, memory_order_relaxed) != me)
            atomic_store_explicit(&l->writer, me, memory_order_relaxed);
    } else if (!(h & bit)) {
        uint32_t w = atomic_load_explicit(&l->writer, memory_order_relaxed);
        if (w != 0 && w != me && on) count(pc, K_SREAD);
        atomic_fetch_or_explicit(&l->holders, bit, memory_order_relaxed);
    }
}

static void access_range(const void *a, size_t n, bool write, const void *pc) {
    if (n == 0) return;
    uintptr_t first = (uintptr_t)a >> 6, last = ((uintptr_t)a + n - 1) >> 6;
    for (uintptr_t l = first; l <= last; l++)
        access_line(l << 6, write, pc);
}

/* ---- the compiler's hooks (-fsanitize=thread) --------------------------------- */

#define RET __builtin_return_address(0)

HIDDEN void __tsan_init(void) {}
HIDDEN void __tsan_func_entry(void *pc) {
    (void)pc;
}
HIDDEN void __tsan_func_exit(void) {}

#define ACCESS_HOOKS(n)                                                                            \
    HIDDEN void __tsan_read##n(void *a) {                                                          \
        access_range(a, n, false, RET);                                                            \
    }                                                                                              \
    HIDDEN void __tsan_write##n(void *a) {                                                         \
        access_range(a, n, true, RET);                                                             \
    }                                                                                              \
    HIDDEN void __tsan_unaligned_read##n(void *a) {                                                \
        access_range(a, n, false, RET);                                                            \
    }                                                                                              \
    HIDDEN void __tsan_unaligned_write##n(void *a) {                                               \
        access_range(a, n, true, RET);                                                             \
    }                                                                                              \
    HIDDEN void __tsan_volatile_read##n(void *a) {                                                 \
        access_range(a, n, false, RET);                                                            \
    }                                                                                              \
    HIDDEN void __tsan_volatile_write##n(void *a) {                                                \
        access_range(a, n, true, RET);                                                             \
    }
ACCESS_HOOKS(1)
ACCESS_HOOKS(2)
ACCESS_HOOKS(4)
ACCESS_HOOKS(8)
ACCESS_HOOKS(16)

HIDDEN void __tsan_read_range(void *a, unsigned long n) {
    access_range(a, n, false, RET);
}
HIDDEN void __tsan_write_range(void *a, unsigned long n) {
    access_range(a, n, true, RET);
}

static void rmw(const volatile void *a, size_t n, const void *pc) {
    if (atomic_load_explicit(&count_on, memory_order_relaxed)) count(pc, K_RMW);
    access_range((const void *)a, n, true, pc);
}

/* The orders arrive in the __ATOMIC_* encoding (0 relaxed .. 5 seq_cst);
 * GCC takes a non-constant order as seq_cst, which counts the same. */
#define ATOMIC_HOOKS(n, T)                                                                         \
    HIDDEN T __tsan_atomic##n##_load(const volatile T *a, int mo) {                                \
        access_range((const void *)a, sizeof(T), false, RET);                                      \
        return __atomic_load_n(a, mo);                                                             \
    }                                                                                              \
    HIDDEN void __tsan_atomic##n##_store(volatile T *a, T v, int mo) {                             \
        access_range((const void *)a, sizeof(T), true, RET);                                       \
        __atomic_store_n(a, v, mo);                                                                \
    }                                                                                              \
    HIDDEN T __tsan_atomic##n##_exchange(volatile T *a, T v, int mo) {                             \
        rmw(a, sizeof(T), RET);                                                                    \
        return __atomic_exchange_n(a, v, mo);                                                      \
    }                                                                                              \
    HIDDEN T __tsan_atomic##n##_fetch_add(volatile T *a, T v, int mo) {                            \
        rmw(a, sizeof(T), RET);                                                                    \
        return __atomic_fetch_add(a, v, mo);                                                       \
    }                                                                                              \
    HIDDEN T __tsan_atomic##n##_fetch_sub(volatile T *a, T v, int mo) {                            \
        rmw(a, sizeof(T), RET);                                                                    \
        return __atomic_fetch_sub(a, v, mo);                                                       \
    }                                                                                              \
    HIDDEN T __tsan_atomic##n##_fetch_and(volatile T *a, T v, int mo) {                            \
        rmw(a, sizeof(T), RET);                                                                    \
        return __atomic_fetch_and(a, v, mo);                                                       \
    }                                                                                              \
    HIDDEN T __tsan_atomic##n##_fetch_or(volatile T *a, T v, int mo) {                             \
        rmw(a, sizeof(T), RET);                                                                    \
        return __atomic_fetch_or(a, v, mo);                                                        \
    }                                                                                              \
    HIDDEN T __tsan_atomic##n##_fetch_xor(volatile T *a, T v, int mo) {                            \
        rmw(a, sizeof(T), RET);                                                                    \
        return __atomic_fetch_xor(a, v, mo);                                                       \
    }                                                                                              \
    HIDDEN T __tsan_atomic##n##_fetch_nand(volatile T *a, T v, int mo) {                           \
        rmw(a, sizeof(T), RET);                                                                    \
        return __atomic_fetch_nand(a, v, mo);                                                      \
    }                                                                                              \
    HIDDEN int __tsan_atomic##n##_compare_exchange_strong(volatile T *a, T *c, T v, int mo,        \
                                                          int fmo) {                               \
        (void)fmo;                                                                                 \
        rmw(a, sizeof(T), RET);                                                                    \
        return __atomic_compare_exchange_n(a, c, v, false, mo, __ATOMIC_RELAXED);                  \
    }                                                                                              \
    HIDDEN int __tsan_atomic##n##_compare_exchange_weak(volatile T *a, T *c, T v, int mo,          \
                                                        int fmo) {                                 \
        (void)fmo;                                                                                 \
        rmw(a, sizeof(T), RET);                                                                    \
        return __atomic_compare_exchange_n(a, c, v, true, mo, __ATOMIC_RELAXED);                   \
    }                                                                                              \
    HIDDEN T __tsan_atomic##n##_compare_exchange_val(volatile T *a, T c, T v, int mo, int fmo) {   \
        (void)fmo;                                                                                 \
        rmw(a, sizeof(T), RET);                                                                    \
        __atomic_compare_exchange_n(a, &c, v, false, mo, __ATOMIC_RELAXED);                        \
        return c;                                                                                  \
    }
ATOMIC_HOOKS(8, int8_t)
ATOMIC_HOOKS(16, int16_t)
ATOMIC_HOOKS(32, int32_t)
ATOMIC_HOOKS(64, int64_t)

HIDDEN void __tsan_atomic_thread_fence(int mo) {
    __atomic_thread_fence(mo);
}
HIDDEN void __tsan_atomic_signal_fence(int mo) {
    __atomic_signal_fence(mo);
}

/* core/box/lock.h, in this build: a lock was taken where our caller is; a
 * mutex's word (`word`, NULL for a spin lock, whose exchange is seen) is
 * written there: one another thread took last costs a line's move. */
HIDDEN __attribute__((noinline)) void hak_count_lock(const void *word) {
    if (atomic_load_explicit(&count_on, memory_order_relaxed)) count(RET, K_LOCK);
    if (word) access_range(word, 1, true, RET);
}

/* ---- what bench/bench_threads.c calls ---------------------------------------- */

/* Zero the counts and count from now on. */
EXPORT void hak_count_begin(void) {
    atomic_store(&count_on, false);
    for (size_t i = 0; i < NSITES; i++) {
        atomic_store_explicit(&sites[i].pc, 0, memory_order_relaxed);
        for (int k = 0; k < NKIND; k++)
            atomic_store_explicit(&sites[i].n[k], 0, memory_order_relaxed);
    }
    atomic_store(&sites_lost, 0);
    atomic_store(&lines_full, 0);
    atomic_store(&count_on, true);
}

EXPORT void hak_count_end(void) {
    atomic_store(&count_on, false);
}

/* Print, per operation (`ops`), the totals ("count total rmw lock swrite
 * sread") and each site ("count site <offset in the library> ..."), to out. */
EXPORT void hak_count_print(FILE *out, double ops) {
    Dl_info dl;
    uintptr_t base = dladdr((void *)hak_count_begin, &dl) ? (uintptr_t)dl.dli_fbase : 0;
    double total[NKIND] = {0};
    for (size_t i = 0; i < NSITES; i++)
        for (int k = 0; k < NKIND; k++)
            total[k] += (double)atomic_load(&sites[i].n[k]);
    fprintf(out, "count total");
    for (int k = 0; k < NKIND; k++)
        fprintf(out, " %s=%.4f", kind_name[k], total[k] / ops);
    fprintf(out, "\n");
    for (size_t i = 0; i < NSITES; i++) {
        uintptr_t pc = atomic_load(&sites[i].pc);
        if (pc == 0) continue;
        fprintf(out, "count site 0x%lx", (unsigned long)(pc - base - 1)); /* the call itself */
        for (int k = 0; k < NKIND; k++)
            fprintf(out, " %s=%.4f", kind_name[k], (double)atomic_load(&sites[i].n[k]) / ops);
        fprintf(out, "\n");
    }
    if (atomic_load(&sites_lost) || atomic_load(&lines_full))
        fprintf(out, "count lost sites=%lu lines=%lu\n", (unsigned long)atomic_load(&sites_lost),
                (unsigned long)atomic_load(&lines_full));
}
