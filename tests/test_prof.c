/* The heap profiler's dump (core/prof/dump.c) where it could hang, fail or
 * count wrong: a lock held for good (exit from a signal handler that
 * interrupted a sample), a dumping thread cancelled, paths longer than the
 * diagnostics buffer, allocations that fail, and blocks realloc resizes
 * (their samples must follow them). Each check runs in a child
 * that turns the profiler on. (tests/check_prof.sh runs it as a user does.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "prof/prof.h"
#include "large/large.h"
#include "death.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

/* A Large block: sampled by the byte countdown, which prof_start arms (the
 * class countdowns of this process started with the profiler off). At a
 * 4 KiB mean gap, surely sampled. */
#define BIG (((size_t)1 << 20) + 1)

static char dir[64];

/* Sampled blocks held while a dump runs: records to write. */
#define HELD 300
static void *held[HELD];

static void hold_samples(void) {
    for (int i = 0; i < HELD; i++)
        held[i] = malloc(BIG);
}

static void drop_samples(void) {
    for (int i = 0; i < HELD; i++)
        free(held[i]);
}

static int make_dir(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/test_prof.XXXXXX");
    assert_non_null(mkdtemp(dir));
    return 0;
}

static int remove_dir(void **state) {
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    return 0;
}

static off_t file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? st.st_size : -1;
}

/* ---- a lock held for good ----------------------------------------------------------
 * The fork handler takes the records' lock, as code the dumping thread
 * interrupted would hold it: the dump gives up after about a second. */

static void dump_beside_a_held_lock(void *arg) {
    (void)arg;
    prof_start(4096, "/dev/null");
    void *p = malloc(BIG); /* (sampled, surely: some record to write) */
    char path[128];
    snprintf(path, sizeof path, "%s/held.heap", dir);
    prof_fork_prepare();
    /* A second by the clock, then it gives up: at least 900 ms, and not
     * much more (20000 naps counted took 2.3 s). On a busy machine the
     * thread may not be running when its second is up, and return late:
     * the lock is still held, so the dump is tried again, up to three
     * times; one of them must end within 600 ms of its second (counted naps
     * would run late every time, the more so on a busy machine). */
    int64_t best = INT64_MAX;
    for (int i = 0; i < 3 && best >= 1600; i++) {
        int64_t t0 = now_ms();
        errno = 0;
        CHILD_CHECK(prof_dump(path) == -1);
        CHILD_CHECK(errno == EDEADLK);
        int64_t waited = now_ms() - t0;
        CHILD_CHECK(waited >= 900);
        if (waited < best) best = waited;
    }
    if (best >= 1600) {
        fprintf(stderr, "the dump gave up %lld ms after it began, at best of 3\n", (long long)best);
        _exit(1);
    }
    prof_exit(); /* the same wait, then a line */
    prof_fork_release(false);
    CHILD_CHECK(prof_dump(path) == 0);
    CHILD_CHECK(file_size(path) > 0);
    free(p);
}

/* The child exited with 0, having printed `line` and no other hakmem line. */
static void expect_only_line(const struct death *d, const char *line) {
    assert_not_hung(d);
    if (!WIFEXITED(d->status) || WEXITSTATUS(d->status) != 0)
        fail_msg("status 0x%x; stderr: %s", d->status, d->err);
    int exact, hak;
    count_lines(d, line, &exact, &hak);
    if (exact != 1 || hak != 1) fail_msg("expected \"%s\"; stderr was:\n%s", line, d->err);
}

static void test_dump_gives_up_on_a_lock_held_for_good(void **state) {
    (void)state;
    struct death d;
    run_child(dump_beside_a_held_lock, NULL, &d);
    char line[128];
    snprintf(line, sizeof line,
             "hakmem: could not write the heap profile to '/dev/null' (errno %d)", EDEADLK);
    expect_only_line(&d, line);
}

/* ---- a profile that cannot be written ------------------------------------------------
 * The line at exit names the file it tried, %p replaced: the setting's
 * pattern would not say which process failed, nor where exactly. */

static void exit_into_no_directory(void *arg) {
    (void)arg;
    char path[128];
    snprintf(path, sizeof path, "%s/no/such/dir/x.%%p.heap", dir);
    prof_start(4096, path);
    fprintf(stderr, "pid=%d\n", (int)getpid());
    void *p = malloc(BIG);
    prof_exit();
    free(p);
}

static void test_exit_names_the_file_it_tried(void **state) {
    (void)state;
    struct death d;
    run_child(exit_into_no_directory, NULL, &d);
    int pid = 0;
    assert_int_equal(sscanf(d.err, "pid=%d", &pid), 1);
    char line[256];
    snprintf(line, sizeof line,
             "hakmem: could not write the heap profile to '%s/no/such/dir/x.%d.heap' (errno %d)",
             dir, pid, ENOENT);
    expect_only_line(&d, line);
}

/* ---- a dumping thread cancelled -------------------------------------------------------
 * A dump is a cancellation point, at its end: a thread dumping in a loop is
 * cancelled, and leaves no lock held behind it. */

static void *dump_forever(void *arg) {
    for (;;)
        prof_dump(arg);
    return NULL;
}

static void cancelled_dumper(void *arg) {
    (void)arg;
    prof_start(4096, "/dev/null");
    hold_samples();
    char path[128];
    snprintf(path, sizeof path, "%s/cancel.heap", dir);
    for (int round = 0; round < 10; round++) {
        pthread_t t;
        CHILD_CHECK(pthread_create(&t, NULL, dump_forever, path) == 0);
        struct timespec wait = {0, (5 + round * 3) * 1000 * 1000};
        nanosleep(&wait, NULL);
        CHILD_CHECK(pthread_cancel(t) == 0);
        void *ret;
        CHILD_CHECK(pthread_join(t, &ret) == 0);
        CHILD_CHECK(ret == PTHREAD_CANCELED);
        drop_samples(); /* frees and samples take the lock */
        hold_samples();
    }
    CHILD_CHECK(prof_dump(path) == 0);
    drop_samples();
}

static void test_cancelled_dump_leaves_no_lock_held(void **state) {
    (void)state;
    expect_clean_exit(cancelled_dumper, NULL);
}

/* ---- near a memory limit ------------------------------------------------------------
 * The dump asks for no memory: with the address space at its limit, it
 * still writes the profile (it is wanted most then). */

static void dump_at_the_limit(void *arg) {
    (void)arg;
    prof_start(4096, "/dev/null");
    hold_samples();
    char path[128];
    snprintf(path, sizeof path, "%s/limit.heap", dir);
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long pages = 0;
    CHILD_CHECK(f != NULL && fscanf(f, "%lu", &pages) == 1);
    fclose(f);
    struct rlimit lim = {pages * 4096 + (64 << 10), pages * 4096 + (64 << 10)};
    CHILD_CHECK(setrlimit(RLIMIT_AS, &lim) == 0);
    CHILD_CHECK(prof_dump(path) == 0);
    CHILD_CHECK(file_size(path) > 0);
    drop_samples();
}

static void test_dump_at_the_address_space_limit(void **state) {
    (void)state;
    expect_clean_exit(dump_at_the_limit, NULL);
}

/* ---- paths ---------------------------------------------------------------------------
 * Up to the 4095 bytes HAKMEM_PROF_FILE keeps, %p and %% expanded. */

static void long_path(void *arg) {
    (void)arg;
    char path[4096];
    int n = snprintf(path, sizeof path, "%s", dir);
    for (int level = 0; level < 3; level++) { /* 3 x 201 bytes: past 512 */
        path[n++] = '/';
        memset(path + n, 'd', 200);
        n += 200;
        path[n] = '\0';
        CHILD_CHECK(mkdir(path, 0700) == 0);
    }
    snprintf(path + n, sizeof path - (size_t)n, "/x%%%%.%%p.heap");
    prof_start(4096, path);
    void *p = malloc(BIG);
    CHILD_CHECK(prof_dump(NULL) == 0);
    snprintf(path + n, sizeof path - (size_t)n, "/x%%.%d.heap", (int)getpid());
    CHILD_CHECK(file_size(path) > 0);
    /* Too long once expanded: refused, nothing written. */
    memset(path, 'e', 4094);
    path[4094] = '\0';
    path[4093] = 'p';
    path[4092] = '%';
    errno = 0;
    CHILD_CHECK(prof_dump(path) == -1 && errno == ENAMETOOLONG);
    free(p);
}

static void test_long_paths_written(void **state) {
    (void)state;
    expect_clean_exit(long_path, NULL);
}

/* ---- allocations that fail -----------------------------------------------------------
 * A sampled allocation that fails for want of memory was not a sample lost:
 * the exit says nothing about lost samples. */

static void failed_sampled(void *arg) {
    (void)arg;
    prof_start(1, "/dev/null"); /* every allocation sampled */
    errno = 0;
    CHILD_CHECK(malloc((size_t)1 << 50) == NULL && errno == ENOMEM);
    void *p = &p;
    CHILD_CHECK(posix_memalign(&p, 4096, (size_t)1 << 50) == ENOMEM);
    prof_exit();
}

static void test_failed_allocation_is_no_lost_sample(void **state) {
    (void)state;
    expect_clean_exit(failed_sampled, NULL);
}

/* ---- realloc ---------------------------------------------------------------------------
 * Every allocation sampled (a mean gap of a byte: each sample counts as
 * itself). A block that realloc keeps, or grows in place, or whose pages it
 * moves, keeps its sample at its new size; one that realloc makes (a
 * buffer's room to grow) is sampled. Each showed 0 bytes before. */

#define KiB ((unsigned long)1 << 10)
#define MiB ((unsigned long)1 << 20)

/* The dump's totals must be n samples of `bytes`. */
static void expect_totals(const char *path, unsigned long n, unsigned long bytes, int line) {
    CHILD_CHECK(prof_dump(path) == 0);
    FILE *f = fopen(path, "r");
    CHILD_CHECK(f != NULL);
    unsigned long got_n, got_bytes;
    CHILD_CHECK(fscanf(f, "heap profile: %lu: %lu", &got_n, &got_bytes) == 2);
    fclose(f);
    if (got_n != n || got_bytes != bytes) {
        fprintf(stderr, "line %d: %lu samples of %lu bytes, expected %lu of %lu\n", line, got_n,
                got_bytes, n, bytes);
        _exit(1);
    }
}
#define EXPECT_TOTALS(n, bytes) expect_totals(path, n, bytes, __LINE__)

static void resized_samples(void *arg) {
    (void)arg;
    prof_start(1, "/dev/null");
    char path[128];
    snprintf(path, sizeof path, "%s/realloc.heap", dir);
    /* (Small blocks are not sampled here: the class countdowns of this
     * process started with the profiler off.) */
    char *buf = malloc(100);
    CHILD_CHECK(buf != NULL);
    EXPECT_TOTALS(0, 0);
    buf = realloc(buf, 5000); /* a Large block with room to grow */
    CHILD_CHECK(buf != NULL);
    EXPECT_TOTALS(1, 5000);
    buf = realloc(buf, 3 * MiB); /* past its room */
    CHILD_CHECK(buf != NULL);
    EXPECT_TOTALS(1, 3 * MiB);
    char *big = malloc(2 * MiB);
    CHILD_CHECK(big != NULL);
    EXPECT_TOTALS(2, 5 * MiB);
    char *shrunk = realloc(big, 1536 * KiB); /* in place */
    CHILD_CHECK(shrunk == big);
    EXPECT_TOTALS(2, 4608 * KiB);
    /* A small block the profiler moved to the Large tier keeps its sample
     * within its class's size (as its class would keep it in place)... */
    char *small = large_alloc_sampled(400, 16, false, 400, true);
    CHILD_CHECK(small != NULL);
    CHILD_CHECK(realloc(small, 390) == small);
    EXPECT_TOTALS(3, 4608 * KiB + 390);
    /* ...past it, it is a new block, where its size goes (a class: not
     * sampled here), and its sample goes... */
    small = realloc(small, 5000);
    CHILD_CHECK(small != NULL);
    EXPECT_TOTALS(2, 4608 * KiB);
    /* ...and so it is shrunk past where its class would keep it: kept, it
     * had a sample its class's blocks, moved and drawn again, did not (at
     * 1024 bytes shrunk to 41, the profile showed twice their bytes). */
    char *shrinking = large_alloc_sampled(1024, 16, false, 1024, true);
    CHILD_CHECK(shrinking != NULL);
    EXPECT_TOTALS(3, 4608 * KiB + 1024);
    char *moved = realloc(shrinking, 41);
    CHILD_CHECK(moved != NULL && moved != shrinking);
    EXPECT_TOTALS(2, 4608 * KiB);
    /* A small size at an alignment no class serves is a Large block, sampled
     * or not: realloc keeps its sample as any Large block's (it was dropped,
     * its unsampled peers drawing only their growth: a third of their
     * bytes showed). */
    char *aligned = aligned_alloc(2 * MiB, 100000);
    CHILD_CHECK(aligned != NULL);
    EXPECT_TOTALS(3, 4608 * KiB + 100000);
    aligned = realloc(aligned, 102400);
    CHILD_CHECK(aligned != NULL);
    EXPECT_TOTALS(3, 4608 * KiB + 102400);
    free(aligned);
    free(moved);
    free(small);
    free(shrunk);
    free(buf);
    EXPECT_TOTALS(0, 0);
    /* Buffers sampled as they grow have mappings of their own already: they
     * are not counted among the sampled small blocks (at most 16384), and
     * their frees do not count them out. */
    for (int i = 0; i < 20000; i++) {
        char *b = realloc(malloc(100), 5000);
        CHILD_CHECK(b != NULL);
        free(b);
    }
    char *after = large_alloc_sampled(100, 16, false, 100, true);
    CHILD_CHECK(after != NULL);
    free(after);
}

static void test_realloc_keeps_and_takes_samples(void **state) {
    (void)state;
    expect_clean_exit(resized_samples, NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dump_gives_up_on_a_lock_held_for_good),
        cmocka_unit_test(test_exit_names_the_file_it_tried),
        cmocka_unit_test(test_cancelled_dump_leaves_no_lock_held),
        cmocka_unit_test(test_dump_at_the_address_space_limit),
        cmocka_unit_test(test_long_paths_written),
        cmocka_unit_test(test_failed_allocation_is_no_lost_sample),
        cmocka_unit_test(test_realloc_keeps_and_takes_samples),
    };
    return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
