/* Arena: one window grown in place; SuperSlabs in its lower half, Pool
 * chunks, L2.5 bundles and heap records carved from its upper half in 2 MiB
 * units without an mmap each, given back read-only and reused lowest first. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "box/arena.h"
#include "box/config.h"
#include "box/os.h"
#include "box/rmap.h"
#include "death.h"
#include "maps.h"
#include "superslab/ss.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#define MiB ((size_t)1 << 20)

#define WINDOW ((size_t)256 << 30)

static void test_halves_of_one_window(void **state) {
    (void)state;
#ifdef HAK_TEST_TSAN
    skip(); /* TSan's mmap drops hint addresses: the arena takes its fallback (whole window) */
#endif
    free(malloc(16)); /* the SuperSlab range exists */
    uintptr_t base = ss_bounds.base;
    size_t span = ss_bounds.span;
    assert_int_equal(base % WINDOW, 0);
    assert_true(span >= 2 * MiB && span <= WINDOW / 2);
    /* The upper half is aligned to its size: one region-map leaf. */
    uint8_t *p = arena_alloc(2 * MiB);
    assert_true((uintptr_t)p >= base + WINDOW / 2 && (uintptr_t)p < base + WINDOW);
    arena_free(p, 2 * MiB);
    /* Reserved as used, not all at once (an address-space limit, and
     * mlockall populating readable pages, count what is reserved). */
    struct arena_stats s;
    arena_get_stats(&s);
    assert_true(s.reserved <= (size_t)256 * MiB);
}

/* Each half grows in place as it fills, by doubling: the SuperSlab range
 * keeps its base and stays readable zeros; units keep coming from the upper
 * half without mappings of their own. */
static void test_halves_grow_in_place(void **state) {
    (void)state;
#ifdef HAK_TEST_TSAN
    skip(); /* TSan's mmap drops hint addresses: the arena takes its fallback (whole window) */
#endif
    free(malloc(16));
    uintptr_t base = 0;
    size_t span = ss_bounds.span;
    assert_true(arena_ss_grow(&base, &span));
    assert_int_equal(base, ss_bounds.base);
    assert_true(span >= 2 * ss_bounds.span);
    char perms[5];
    assert_true(maps_perms((void *)(base + span - 1), perms));
    assert_string_equal(perms, "r--p");
    assert_int_equal(*(volatile uint8_t *)(base + span - 1), 0);
    struct arena_stats s0, s1;
    arena_get_stats(&s0);
    uint8_t *u[64];
    for (int i = 0; i < 64; i++) { /* 128 MiB: past the first steps */
        u[i] = arena_alloc(2 * MiB);
        assert_true((uintptr_t)u[i] >= base + WINDOW / 2 && (uintptr_t)u[i] < base + WINDOW);
        u[i][0] = 1;
    }
    arena_get_stats(&s1);
    assert_int_equal(s1.fallbacks, s0.fallbacks);
    assert_true(s1.reserved > s0.reserved);
    for (int i = 0; i < 64; i++)
        arena_free(u[i], 2 * MiB);
}

static void test_alloc_commits_free_gives_back(void **state) {
    (void)state;
    arena_free(arena_alloc(2 * MiB), 2 * MiB); /* the window is placed */
    uint64_t mm = os_calls(OS_MMAP);
    uint8_t *p = arena_alloc(4 * MiB);
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % (2 * MiB), 0);
    assert_true(maps_writable(p) && maps_writable(p + 4 * MiB - ARENA_GUARD - 1));
    for (size_t k = 0; k < 4 * MiB - ARENA_GUARD; k += 4096)
        assert_int_equal(p[k], 0);
    memset(p, 0x3c, 4 * MiB - ARENA_GUARD);
    assert_int_equal(os_calls(OS_MMAP), mm); /* no mapping of its own */
    arena_free(p, 4 * MiB);
    assert_true(maps_given_back(p, 4 * MiB));
    /* The place is reused (or a lower one), and reads as zero again. */
    uint8_t *q = arena_alloc(4 * MiB);
    assert_true(q <= p);
    assert_int_equal(p[12345], 0);
    assert_int_equal(q[12345], 0);
    arena_free(q, 4 * MiB);
}

/* Writes from 1 MiB into a run up to 1 MiB into the run after it. */
static void write_across(void *arg) {
    volatile uint8_t *a = arg;
    for (size_t k = 1 * MiB; k < 3 * MiB; k++)
        a[k] = 0x41;
    _exit(0);
}

/* Two runs side by side: a run of writes off the first one's end faults
 * on its guard page, with guard markers and without (mprotect). */
static void runs_end_in_guards(void) {
    uint8_t *a = arena_alloc(2 * MiB), *b = arena_alloc(2 * MiB);
    assert_ptr_equal(b, a + 2 * MiB);
    memset(a, 1, 2 * MiB - ARENA_GUARD);
    memset(b, 1, 2 * MiB - ARENA_GUARD);
    struct death d;
    run_child(write_across, a, &d);
    assert_true(WIFSIGNALED(d.status) && WTERMSIG(d.status) == SIGSEGV);
    assert_false(maps_writable(a + 2 * MiB - 1) && !os_guard_markers());
    arena_free(a, 2 * MiB);
    arena_free(b, 2 * MiB);
}

static void test_runs_end_in_guard_pages(void **state) {
    (void)state;
    runs_end_in_guards();
    os_fault_no_markers(true);
    runs_end_in_guards();
    os_fault_no_markers(false);
}

static void write_run(void *arg) {
    memset(arg, 0x41, 4 * MiB - ARENA_GUARD);
    _exit(0);
}

/* A run's guard marker outlives the run when its units go back by the
 * fallback (the kernel refused the fresh mapping: the pages are dropped
 * where they are, markers kept); a longer run over those units later must
 * not fault in its middle (found by fuzz_api). */
static void test_reused_units_lose_old_guards(void **state) {
    (void)state;
    uint8_t *a = arena_alloc(2 * MiB), *b = arena_alloc(2 * MiB);
    assert_ptr_equal(b, a + 2 * MiB);
    arena_free(b, 2 * MiB);
    os_fault_only(1u << OS_SITE_UNCOMMIT_MAP);
    os_fault_arm(0, UINT64_MAX);
    arena_free(a, 2 * MiB); /* a's guard (its last page) stays, with markers */
    os_fault_disarm();
    os_fault_only(~0u);
    uint8_t *c = arena_alloc(4 * MiB);
    assert_ptr_equal(c, a); /* the lowest two free units: a's and b's */
    struct death d;
    run_child(write_run, c, &d);
    assert_true(WIFEXITED(d.status) && WEXITSTATUS(d.status) == 0);
    arena_free(c, 4 * MiB);
}

#ifndef HAK_TEST_TSAN /* (an address-space limit: TSan reserves terabytes) */
/* Bytes of address space this process has mapped. */
static size_t vm_size(void) {
    unsigned long pages = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%lu", &pages) != 1) pages = 0;
        fclose(f);
    }
    return pages * 4096;
}

/* The same through arena_trim: under an address-space limit it makes free
 * units at the top never-used again; when unmapping their reservation is
 * refused they stay as arena_free left them, marker and all, and the next
 * run from the top takes them as new (found by a review). */
static void trim_then_take(void *arg) {
    (void)arg;
    size_t limit = vm_size() + ((size_t)1 << 30);
    struct rlimit rl = {limit, limit};
    CHILD_CHECK(setrlimit(RLIMIT_AS, &rl) == 0);
    uint8_t *a = arena_alloc(64 * MiB); /* from the top: no 32 free units in a row below */
    CHILD_CHECK(a != NULL);
    os_fault_only(1u << OS_SITE_UNCOMMIT_MAP);
    os_fault_arm(0, UINT64_MAX);
    arena_free(a, 64 * MiB); /* its guard marker stays */
    os_fault_only(1u << OS_SITE_MUNMAP);
    os_fault_arm(0, UINT64_MAX);
    arena_trim(); /* its units are the top's again, their unmap refused */
    os_fault_disarm();
    os_fault_only(~0u);
    uint8_t *c = arena_alloc(128 * MiB);
    /* (From the top, which may now be lower than a: over a's old guard.) */
    CHILD_CHECK(c != NULL && c <= a && c + 128 * MiB >= a + 64 * MiB);
    for (size_t k = 0; k < 128 * MiB - ARENA_GUARD; k += 4096)
        c[k] = 0x41;
    _exit(0);
}

static void test_top_units_lose_old_guards(void **state) {
    (void)state;
    struct death d;
    run_child(trim_then_take, NULL, &d);
    if (!WIFEXITED(d.status) || WEXITSTATUS(d.status) != 0)
        fail_msg("child status %#x: %s", d.status, d.err);
}
#endif

static void test_runs_of_free_units(void **state) {
    (void)state;
    uint8_t *a = arena_alloc(2 * MiB), *b = arena_alloc(2 * MiB), *c = arena_alloc(2 * MiB);
    assert_ptr_equal(b, a + 2 * MiB);
    assert_ptr_equal(c, b + 2 * MiB);
    arena_free(a, 2 * MiB);
    arena_free(c, 2 * MiB);
    /* a and c are free but not adjacent: a 4 MiB request goes elsewhere, a
     * 1 MiB one takes the lowest free unit. */
    uint8_t *d = arena_alloc(4 * MiB);
    assert_true(d != a && d != c);
    uint8_t *e = arena_alloc(1 * MiB);
    assert_ptr_equal(e, a);
    arena_free(b, 2 * MiB);
    uint8_t *f = arena_alloc(4 * MiB); /* b and c together now */
    assert_ptr_equal(f, b);
    arena_free(d, 4 * MiB);
    arena_free(e, 1 * MiB);
    arena_free(f, 4 * MiB);
}

static void test_tiers_map_nothing(void **state) {
    (void)state;
    /* Pool chunks, L2.5 bundles and SuperSlabs: not one mmap between them.
     * (No ageing meanwhile: what an earlier test left unused for twice the
     * age is unmapped then, a mapping of its own, on a slow build's clock.) */
    uint64_t age = hak_cfg.age_ms;
    hak_cfg.age_ms = 3600 * 1000;
    free(malloc(100));
    free(malloc(20000));
    free(malloc(300000));
    /* A first round grows the arena's reservation as far as the pattern
     * needs (a reservation step is one mmap of address space); the second
     * maps nothing. */
    uint64_t mm = 0;
    void *p[64];
    for (int round = 0; round < 2; round++) {
        mm = os_calls(OS_MMAP);
        for (int i = 0; i < 64; i++)
            p[i] = malloc(i % 2 ? 40000 : 500000);
        for (int i = 0; i < 64; i++)
            free(p[i]);
    }
    uint64_t calls = os_calls(OS_MMAP);
    hak_cfg.age_ms = age;
    assert_int_equal(calls, mm);
    struct arena_stats s;
    arena_get_stats(&s);
    assert_int_equal(s.fallbacks, 0);
}

/* ---- under an address-space limit --------------------------------------------------------- */

/* Under RLIMIT_AS (ulimit -v) every byte of address space reserved counts:
 * the program must get nearly all of its limit. A fresh process (this binary
 * re-executed) sets a limit 256 MiB above what it has mapped, fills it with
 * 256 KiB blocks, frees them and fills it again. A reservation sized
 * without regard to the limit (128 MiB of the 256) left it half. */
#define LIMIT_CHILD_ARG "--limit-child"
#define LIMIT_ROOM      ((size_t)256 << 20)
#define LIMIT_BLOCK     ((size_t)256 << 10)

static long vm_size_kb(void) {
    static char buf[4096];
    int fd = open("/proc/self/status", O_RDONLY);
    ssize_t n = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
    if (fd >= 0) close(fd);
    buf[n > 0 ? n : 0] = 0;
    const char *l = strstr(buf, "VmSize:");
    return l ? strtol(l + 7, NULL, 10) : -1;
}

/* Blocks of `size` until malloc fails (errno ENOMEM); their bytes. */
static size_t fill(uint8_t **b, size_t max, size_t size, size_t *n) {
    for (*n = 0; *n < max; (*n)++) {
        errno = 0;
        b[*n] = malloc(size);
        if (b[*n] == NULL) {
            if (errno != ENOMEM) _exit(3);
            break;
        }
        b[*n][0] = b[*n][size - 1] = (uint8_t)*n;
    }
    return *n * size;
}

/* Check and free what fill gave. */
static bool drain(uint8_t **b, size_t size, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (b[i][0] != (uint8_t)i || b[i][size - 1] != (uint8_t)i) return false;
        free(b[i]);
    }
    return true;
}

static int limit_child(void) {
    static uint8_t *b[1 << 16];
    const size_t max = sizeof b / sizeof b[0];
    long vsz = vm_size_kb();
    if (vsz < 0) return 2;
    struct rlimit rl = {(rlim_t)vsz * 1024 + LIMIT_ROOM, (rlim_t)vsz * 1024 + LIMIT_ROOM};
    if (setrlimit(RLIMIT_AS, &rl) != 0) return 2;
    size_t n1, n2, n3;
    size_t got1 = fill(b, max, LIMIT_BLOCK, &n1);
    if (!drain(b, LIMIT_BLOCK, n1)) return 4;
    size_t got2 = fill(b, max, LIMIT_BLOCK, &n2);
    if (!drain(b, LIMIT_BLOCK, n2)) return 4;
    /* Other sizes now: what the first ones left cached must make way. */
    size_t got3 = fill(b, max, 20000, &n3);
    if (!drain(b, 20000, n3)) return 4;
    printf("got %zu MiB, then %zu MiB, then %zu MiB in 20 KB blocks, of a %zu MiB limit\n",
           got1 >> 20, got2 >> 20, got3 >> 20, LIMIT_ROOM >> 20);
    fflush(stdout);
    if (got1 < LIMIT_ROOM * 3 / 4) return 5;
    if (got2 < got1 * 9 / 10) return 6;
    if (got3 < LIMIT_ROOM * 3 / 4) return 7;
    return 0;
}

static void test_most_of_an_address_space_limit(void **state) {
    (void)state;
#ifdef HAK_TEST_TSAN
    skip(); /* TSan's mmap drops hint addresses: the arena takes its fallback (whole window) */
#endif
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        char *argv[] = {"test_arena", LIMIT_CHILD_ARG, NULL};
        execv("/proc/self/exe", argv);
        _exit(21);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail_msg("child status 0x%x: exit codes in limit_child (5, 7: under 3/4 of the limit)", st);
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], LIMIT_CHILD_ARG) == 0) return limit_child();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_halves_of_one_window),
        cmocka_unit_test(test_alloc_commits_free_gives_back),
        cmocka_unit_test(test_runs_end_in_guard_pages),
        cmocka_unit_test(test_reused_units_lose_old_guards),
#ifndef HAK_TEST_TSAN
        cmocka_unit_test(test_top_units_lose_old_guards),
#endif
        cmocka_unit_test(test_runs_of_free_units),
        cmocka_unit_test(test_tiers_map_nothing),
        cmocka_unit_test(test_most_of_an_address_space_limit),
        cmocka_unit_test(test_halves_grow_in_place), /* last: leaves free units behind */
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
