/* OS boundary: aligned mappings, in-place resize, page moves, decommit,
 * reserve/commit/uncommit, and the per-kind call counts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "box/os.h"
#include "hakmem.h"
#include "sizes.h"

#include "maps.h"
#include "timing.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef HAK_TEST_TSAN /* (ThreadSanitizer's start-up reads limits before its atomics work) */
/* The program's getrlimit, counted: what the allocator asks the kernel. */
static _Atomic uint64_t getrlimit_calls;
int getrlimit(__rlimit_resource_t res, struct rlimit *rl) {
    if (res == RLIMIT_AS) atomic_fetch_add(&getrlimit_calls, 1);
    return (int)syscall(SYS_prlimit64, 0, res, NULL, rl);
}

static uint64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* The limit is a system call (a lock of the whole process in the kernel)
 * that a Large malloc asked for each time (malloc-large: 1967 of them): its
 * per-allocation look reads it at most once per 10 ms of the coarse clock
 * (whose tick is at most 10 ms). */
static void test_as_limit_read_once_per_tick(void **state) {
    (void)state;
    uint64_t start = now_ms(), before = atomic_load(&getrlimit_calls);
    for (int i = 0; i < 100000; i++)
        (void)os_as_limit_recent();
    uint64_t calls = atomic_load(&getrlimit_calls) - before, ms = now_ms() - start;
    assert_true(calls <=
                3 + ms / 10); /* (a first read, and the coarse clock's start up to a tick behind) */
}

/* A limit the program sets: os_as_limit knows it at once (its callers keep
 * what they decide: reservations, chunk sizes; with a 10 ms old reading, a
 * program that lowered its limit and allocated at once got 586-911 MiB
 * where it had 939: reservations kept as if there were no limit), and a
 * refused call makes the next os_as_limit_recent read it again. */
static void test_as_limit_read_after_setting_or_refusal(void **state) {
    (void)state;
    struct rlimit old, lim;
    assert_int_equal(getrlimit(RLIMIT_AS, &old), 0);
    size_t was = os_as_limit_recent();
    lim = old;
    lim.rlim_cur = (rlim_t)1 << 40;
    if (lim.rlim_max != RLIM_INFINITY && lim.rlim_cur > lim.rlim_max) lim.rlim_cur = lim.rlim_max;
    if (lim.rlim_cur == old.rlim_cur) lim.rlim_cur -= (rlim_t)1 << 30;
    assert_int_equal(setrlimit(RLIMIT_AS, &lim), 0);
    assert_int_equal(os_as_limit(), (size_t)lim.rlim_cur);
    assert_int_equal(setrlimit(RLIMIT_AS, &old), 0);
    assert_int_equal(os_as_limit(), was);
    assert_int_equal(setrlimit(RLIMIT_AS, &lim), 0);
    assert_null(os_map_aligned((size_t)1 << 47, HAK_PAGE_SIZE)); /* (more than the address space) */
    assert_int_equal(os_as_limit_recent(), (size_t)lim.rlim_cur);
    assert_int_equal(setrlimit(RLIMIT_AS, &old), 0);
    assert_null(os_map_aligned((size_t)1 << 47, HAK_PAGE_SIZE));
    assert_int_equal(os_as_limit_recent(), was);
}
#endif

static void test_map_aligned_honours_alignment(void **state) {
    (void)state;
    size_t aligns[] = {HAK_PAGE_SIZE, 64 << 10, HAK_REGION_SIZE, 4 << 20, 64 << 20};
    for (size_t i = 0; i < sizeof aligns / sizeof aligns[0]; i++) {
        uint64_t before = os_calls(OS_MMAP);
        size_t size = 3 * HAK_PAGE_SIZE;
        uint8_t *p = os_map_aligned(size, aligns[i]);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % aligns[i], 0);
        assert_true(os_calls(OS_MMAP) > before);
        for (size_t k = 0; k < size; k++)
            assert_int_equal(p[k], 0);
        memset(p, 0x5a, size);
        os_unmap(p, size);
    }
}

static void test_counts_every_kind(void **state) {
    (void)state;
    uint64_t mm = os_calls(OS_MMAP), mu = os_calls(OS_MUNMAP), ma = os_calls(OS_MADVISE),
             mr = os_calls(OS_MREMAP);
    uint8_t *p = os_map_aligned(HAK_PAGE_SIZE, HAK_PAGE_SIZE);
    assert_non_null(p);
    os_decommit(p, HAK_PAGE_SIZE);
    assert_true(os_resize(p, HAK_PAGE_SIZE, HAK_PAGE_SIZE)); /* same size: a no-op remap */
    os_unmap(p, HAK_PAGE_SIZE);
    assert_int_equal(os_calls(OS_MMAP), mm + 1);
    assert_int_equal(os_calls(OS_MADVISE), ma + 1);
    assert_int_equal(os_calls(OS_MREMAP), mr + 1);
    assert_int_equal(os_calls(OS_MUNMAP), mu + 1);
}

static void test_decommit_reads_zero(void **state) {
    (void)state;
    size_t size = 16 * HAK_PAGE_SIZE;
    uint8_t *p = os_map_aligned(size, HAK_REGION_SIZE);
    assert_non_null(p);
    memset(p, 0xab, size);
    os_decommit(p, size);
    for (size_t k = 0; k < size; k += 511)
        assert_int_equal(p[k], 0);
    os_unmap(p, size);
}

static void test_resize_in_place_keeps_contents(void **state) {
    (void)state;
    /* A 2 MiB-aligned mapping from the hint area normally has room after it. */
    size_t small = 4 * HAK_PAGE_SIZE, big = 64 * HAK_PAGE_SIZE;
    uint8_t *p = os_map_aligned(small, HAK_REGION_SIZE);
    assert_non_null(p);
    for (size_t k = 0; k < small; k++)
        p[k] = (uint8_t)(k * 7);
    if (os_resize(p, small, big)) {
        for (size_t k = 0; k < small; k++)
            assert_int_equal(p[k], (uint8_t)(k * 7));
        p[big - 1] = 1; /* the grown part is usable */
        assert_true(os_resize(p, big, small));
    }
    os_unmap(p, small);
}

static void test_move_keeps_contents(void **state) {
    (void)state;
    size_t old = 8 * HAK_PAGE_SIZE, new = 32 * HAK_PAGE_SIZE;
    uint8_t *p = os_map_aligned(old, HAK_REGION_SIZE);
    uint8_t *dst = os_map_aligned(new, HAK_REGION_SIZE);
    assert_non_null(p);
    assert_non_null(dst);
    for (size_t k = 0; k < old; k++)
        p[k] = (uint8_t)(k * 13);
    assert_true(os_move(p, old, new, dst));
    for (size_t k = 0; k < old; k++)
        assert_int_equal(dst[k], (uint8_t)(k * 13));
    dst[new - 1] = 1;
    os_unmap(dst, new);
}

/* os_mapped follows every mapping the boundary makes and gives back, of
 * any protection, exactly; the peak never falls. (Nothing here allocates
 * between the reads.) */
static void test_mapped_bytes_exact(void **state) {
    (void)state;
    const uint64_t mb = 1 << 20;
    uint64_t m0 = os_mapped();
    assert_true(os_mapped_peak() >= m0);
    uint8_t *p = os_map_aligned(4 * mb, HAK_REGION_SIZE); /* over-mapped and trimmed or not */
    assert_non_null(p);
    assert_int_equal(os_mapped(), m0 + 4 * mb);
    assert_true(os_mapped_peak() >= m0 + 4 * mb);
    if (os_resize(p, 4 * mb, 6 * mb)) {
        assert_int_equal(os_mapped(), m0 + 6 * mb);
        assert_true(os_resize(p, 6 * mb, 4 * mb));
    }
    assert_int_equal(os_mapped(), m0 + 4 * mb);
    uint8_t *dst = os_map_aligned(8 * mb, HAK_REGION_SIZE);
    assert_non_null(dst);
    assert_int_equal(os_mapped(), m0 + 12 * mb);
    assert_true(os_move(p, 4 * mb, 8 * mb, dst)); /* p's mapping goes, dst's stays */
    assert_int_equal(os_mapped(), m0 + 8 * mb);
    uint64_t peak = os_mapped_peak();
    assert_true(peak >= m0 + 12 * mb);
    assert_true(os_unmap(dst, 8 * mb));
    assert_int_equal(os_mapped(), m0);
    /* Reserved address space counts; committing and uncommitting inside it
     * change nothing. */
    size_t size = 64 * mb;
    uint8_t *r = os_reserve(&size, 64 * mb, HAK_REGION_SIZE);
    assert_non_null(r);
    assert_int_equal(os_mapped(), m0 + size);
    assert_true(os_commit(r, HAK_REGION_SIZE));
    os_uncommit(r, HAK_REGION_SIZE);
    assert_int_equal(os_mapped(), m0 + size);
    /* Grown in place, or refused (the place taken: a mapping the kernel put
     * elsewhere is unmapped again). */
    bool grown = os_reserve_at(r + size, 2 * mb);
    assert_int_equal(os_mapped(), m0 + size + (grown ? 2 * mb : 0));
    if (grown) assert_true(os_unmap(r + size, 2 * mb));
    assert_true(os_unmap(r, size));
    assert_int_equal(os_mapped(), m0);
    assert_true(os_mapped_peak() >= peak);
}

/* A reservation reads as zeros and cannot be written; a committed part can,
 * and once uncommitted its pages are gone and it is read-only again, in the
 * same place. */
static void test_reserve_commit_uncommit(void **state) {
    (void)state;
    size_t size = (size_t)1 << 30;
    uint8_t *r = os_reserve(&size, (size_t)64 << 20, HAK_REGION_SIZE);
    assert_non_null(r);
    assert_true(size >= ((size_t)64 << 20) && size <= ((size_t)1 << 30));
    assert_int_equal((uintptr_t)r & (HAK_REGION_SIZE - 1), 0);
    char perms[5];
    assert_true(maps_perms(r, perms));
    assert_string_equal(perms, "---p"); /* nothing mlockall would populate */
    assert_true(os_readable(r, size));
    assert_false(maps_writable(r));
    assert_int_equal(r[0], 0);
    assert_int_equal(r[size - 1], 0);
    uint8_t *p = r + 3 * HAK_REGION_SIZE;
    uint64_t mm = os_calls(OS_MMAP), pr = os_calls(OS_MPROTECT);
    assert_true(os_commit(p, HAK_REGION_SIZE));
    assert_int_equal(os_calls(OS_MMAP), mm); /* no new mapping: no hole on refusal */
    assert_int_equal(os_calls(OS_MPROTECT) - pr, 1);
    assert_true(maps_writable(p));
    assert_false(maps_writable(p + HAK_REGION_SIZE));
    memset(p, 0xab, HAK_REGION_SIZE);
    assert_true(maps_resident(p + 4096));
    os_uncommit(p, HAK_REGION_SIZE);
    assert_true(maps_given_back(p, HAK_REGION_SIZE));
    assert_int_equal(p[4096], 0);
    /* And again, in the same place. */
    assert_true(os_commit(p, HAK_REGION_SIZE));
    assert_int_equal(p[100], 0);
    p[100] = 1;
    os_uncommit(p, HAK_REGION_SIZE);
    os_unmap(r, size);
}

/* A reservation grows in place: os_reserve_at takes a free place exactly,
 * and refuses one that is taken, leaving what is there alone. */
static void test_reserve_at(void **state) {
    (void)state;
    size_t size = (size_t)64 << 20, half = size / 2;
    uint8_t *r = os_reserve(&size, size, HAK_REGION_SIZE);
    assert_non_null(r);
    os_unmap(r + half, half);
    assert_true(os_reserve_at(r + half, half));
    char perms[5];
    assert_true(maps_perms(r + half, perms));
    assert_string_equal(perms, "---p");
    assert_true(os_commit(r + half - HAK_PAGE_SIZE, 2 * HAK_PAGE_SIZE)); /* across the seam */
    r[half - 1] = 1;
    r[half] = 2;
    assert_false(os_reserve_at(r + half - HAK_REGION_SIZE, HAK_REGION_SIZE)); /* taken */
    assert_int_equal(r[half - 1], 1);
    assert_int_equal(r[half], 2);
    assert_true(maps_writable(r + half));
    os_unmap(r, size);
}

/* Kilobytes on the "<key>:" line of /proc/self/status. */
static long status_kb(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, key, strlen(key)) == 0) v = strtol(line + strlen(key), NULL, 10);
    if (f) fclose(f);
    return v;
}

/* Run body in a child (mlockall is for the whole process): its exit code
 * is body's result, 0 for success, 77 to skip (not allowed here), else the
 * number of the step that failed (see the body). */
static void in_child(int (*body)(void)) {
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) _exit(body());
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    if (WEXITSTATUS(st) == 77) skip();
    if (WEXITSTATUS(st) != 0) fail_msg("child exit %d (see the test)", WEXITSTATUS(st));
}

/* Under mlockall(MCL_FUTURE) a reservation must not be populated (page
 * tables for all of it), but what is committed is locked, as the program
 * asked. In a child: mlockall is for the whole process. */
static int test_reserve_under_mlockall_child(void) {
    if (!maps_mlockall(MCL_CURRENT | MCL_FUTURE)) return 77; /* not allowed here */
    long lck0 = status_kb("VmLck:"), pte0 = status_kb("VmPTE:");
    size_t size = (size_t)8 << 30;
    uint8_t *r = os_reserve(&size, (size_t)64 << 20, HAK_REGION_SIZE);
    if (r == NULL) return 2;
    long lck1 = status_kb("VmLck:"), pte1 = status_kb("VmPTE:");
    /* 8 GiB populated would lock 8 GiB and take 16 MiB of page tables. */
    if (lck1 - lck0 > 4096 || pte1 - pte0 > 1024) return 3;
    if (!os_commit(r, HAK_REGION_SIZE)) return 4;
    long lck2 = status_kb("VmLck:");
    if (lck2 - lck1 < 2048) return 5; /* the committed 2 MiB is locked */
    os_uncommit(r, HAK_REGION_SIZE);
    if (!maps_given_back(r, HAK_REGION_SIZE)) return 6;
    return 0;
}

/* A program that locks its memory once it is running (mlockall(MCL_CURRENT |
 * MCL_FUTURE), as daemons holding secrets and real-time programs do) locks,
 * and has the kernel populate, every readable page it has: it must not pay
 * for address space hakmem only reserved. With a readable 256 GiB
 * reservation that was 60 s and 512 MiB of page tables. */
static int test_mlockall_after_start_child(void) {
    hak_free(hak_malloc(100)); /* every tier has its memory */
    hak_free(hak_malloc(20000));
    hak_free(hak_malloc(300000));
    hak_free(hak_malloc(3 << 20));
    long pte0 = status_kb("VmPTE:");
    /* The old cost, bounded (scaled: tests/timing.h); it takes under 0.1 s
     * now. A slow machine may stretch the time taken: the page tables
     * (512 MiB then) tell the old cost from a slow machine in any case. */
    int64_t t0 = hak_test_now_ms();
    hak_test_alarm(30000, "mlockall(MCL_CURRENT | MCL_FUTURE)");
    if (!maps_mlockall(MCL_CURRENT | MCL_FUTURE)) return 77;
    alarm(0);
    if (hak_test_now_ms() - t0 > hak_test_limit_ms(5000)) return 2;
    if (status_kb("VmPTE:") - pte0 > 8192) return 3; /* KiB of page tables */
    for (int i = 0; i < 100; i++) {
        void *p = hak_malloc((size_t)i * 1000);
        if (p == NULL) return 4;
        memset(p, 1, (size_t)i * 1000);
        hak_free(p);
    }
    return 0;
}

static void test_mlockall_after_start(void **state) {
    (void)state;
    in_child(test_mlockall_after_start_child);
}

static void test_reserve_under_mlockall(void **state) {
    (void)state;
    in_child(test_reserve_under_mlockall_child);
}

/* Under mlockall(MCL_FUTURE | MCL_ONFAULT) nothing is populated, so the
 * lock must be learnt another way; given back, a committed part must lose
 * its pages (locked pages would keep them: old bytes in a "zero" unit). */
static int test_reserve_under_mlockall_onfault_child(void) {
    if (!maps_mlockall(MCL_CURRENT | MCL_FUTURE | MCL_ONFAULT)) return 77;
    size_t size = (size_t)8 << 30;
    uint8_t *r = os_reserve(&size, (size_t)64 << 20, HAK_REGION_SIZE);
    if (r == NULL) return 2;
    if (!os_commit(r, HAK_REGION_SIZE)) return 4;
    memset(r, 0xab, HAK_REGION_SIZE);
    os_uncommit(r, HAK_REGION_SIZE);
    if (!maps_given_back(r, HAK_REGION_SIZE)) return 6;
    if (r[4096] != 0) return 7;
    if (!os_commit(r, HAK_REGION_SIZE)) return 8;
    if (r[8192] != 0) return 9;
    return 0;
}

static void test_reserve_under_mlockall_onfault(void **state) {
    (void)state;
    in_child(test_reserve_under_mlockall_onfault_child);
}

/* A child of a process under mlockall(MCL_FUTURE) is not under it (fork(2)):
 * what it commits must not be locked by hakmem either. */
static int test_fork_child_not_locked_child(void) {
    hak_free(hak_malloc(16)); /* hakmem started: its fork handlers are in */
    if (!maps_mlockall(MCL_CURRENT | MCL_FUTURE)) return 77;
    size_t size = (size_t)8 << 30;
    uint8_t *r = os_reserve(&size, (size_t)64 << 20, HAK_REGION_SIZE);
    if (r == NULL) return 2;
    pid_t g = fork(); /* hakmem's fork handlers run */
    if (g < 0) return 3;
    if (g == 0) {
        long lck0 = status_kb("VmLck:");
        if (!os_commit(r, HAK_REGION_SIZE)) _exit(4);
        _exit(status_kb("VmLck:") - lck0 >= 2048 ? 5 : 0);
    }
    int gs;
    if (waitpid(g, &gs, 0) != g || !WIFEXITED(gs)) return 6;
    return WEXITSTATUS(gs);
}

static void test_fork_child_not_locked(void **state) {
    (void)state;
    in_child(test_fork_child_not_locked_child);
}

/* Review find: an EINVAL for an unaligned range (a caller's bug) was taken
 * as a kernel without MADV_POPULATE_WRITE, and no block of the process was
 * populated again. */
static void test_populate_unaligned_refusal_not_sticky(void **state) {
    (void)state;
    uint8_t *m =
        mmap(NULL, 4 * HAK_PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(m != MAP_FAILED);
    if (!os_populate(m, HAK_PAGE_SIZE)) skip(); /* a kernel before 5.14 */
    assert_true(maps_resident(m));
    assert_false(os_populate(m + 64, HAK_PAGE_SIZE));
    assert_true(os_populate(m + 2 * HAK_PAGE_SIZE, HAK_PAGE_SIZE));
    assert_true(maps_resident(m + 2 * HAK_PAGE_SIZE));
    munmap(m, 4 * HAK_PAGE_SIZE);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_map_aligned_honours_alignment),
#ifndef HAK_TEST_TSAN
        cmocka_unit_test(test_as_limit_read_once_per_tick),
        cmocka_unit_test(test_as_limit_read_after_setting_or_refusal),
#endif
        cmocka_unit_test(test_reserve_under_mlockall_onfault),
        cmocka_unit_test(test_fork_child_not_locked),
        cmocka_unit_test(test_counts_every_kind),
        cmocka_unit_test(test_mapped_bytes_exact),
        cmocka_unit_test(test_decommit_reads_zero),
        cmocka_unit_test(test_resize_in_place_keeps_contents),
        cmocka_unit_test(test_move_keeps_contents),
        cmocka_unit_test(test_reserve_commit_uncommit),
        cmocka_unit_test(test_reserve_under_mlockall),
        cmocka_unit_test(test_reserve_at),
        cmocka_unit_test_teardown(test_mlockall_after_start, hak_test_alarm_off),
        cmocka_unit_test(test_populate_unaligned_refusal_not_sticky),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
