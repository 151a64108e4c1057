/* fork() while other threads are inside the allocator: the child must get a
 * consistent, unlocked heap. Children report by exit status only (no cmocka
 * in a child); every wait is bounded so a deadlocked child fails the test
 * instead of hanging it. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "rng.h"
#include "timing.h"

#define KiB ((size_t)1024)
#define MiB (KiB * 1024)

/* A child still running after this (scaled: tests/timing.h) is killed as
 * deadlocked. The children take up to 80 ms in the debug build, 210 ms
 * under TSan: 10 s is over a hundred times that. */
#define CHILD_LIMIT_BASE_MS 10000
/* test_fork_with_allocating_handlers, whole (20 forks): 0.14 s in the debug
 * build, 0.47 s under TSan. */
#define HANDLERS_LIMIT_BASE_MS 30000

/* Child exit codes, so a failure says what went wrong. */
enum { CHILD_OK = 0, CHILD_NULL = 2, CHILD_PATTERN = 3, CHILD_ALIGN = 4, CHILD_THREAD = 5 };

static unsigned char pat(uintptr_t base, size_t n, size_t i) {
    return (unsigned char)((base >> 4) + n * 13 + i * 7 + (i >> 8));
}

/* Dense over the first/last 1 KiB, every 256th byte in between. */
static bool pattern(void *p, size_t n, bool write) {
    unsigned char *c = p;
    for (size_t i = 0; i < n; i += (i < 1024 || i + 1024 >= n) ? 1 : 256) {
        unsigned char v = pat((uintptr_t)p, n, i);
        if (write)
            c[i] = v;
        else if (c[i] != v)
            return false;
    }
    return true;
}

static size_t pick_size(uint64_t *rng) {
    uint64_t r = rng_next(rng);
    if (r % 1000 == 0) return 1 * MiB + (size_t)((r >> 8) % (1 * MiB));
    unsigned bits = (unsigned)((r >> 8) % 17);
    return (size_t)((r >> 16) & ((1ull << bits) - 1));
}

/* ---- parent-side hammer threads -------------------------------------------- */

static atomic_bool g_stop;
static atomic_long g_hammer_errors;

static void *hammer(void *arg) {
    uint64_t rng = (uint64_t)(uintptr_t)arg * 7919 + 1;
    /* Lowest priority: the hammers still fill idle CPU time (so forks land
     * while they are inside malloc) but cannot starve the children. */
    setpriority(PRIO_PROCESS, (id_t)gettid(), 19);
    void *live[64] = {0};
    size_t len[64] = {0};
    while (!atomic_load_explicit(&g_stop, memory_order_relaxed)) {
        unsigned s = (unsigned)(rng_next(&rng) % 64);
        if (live[s] != NULL) {
            if (!pattern(live[s], len[s], false)) atomic_fetch_add(&g_hammer_errors, 1);
            free(live[s]);
        }
        len[s] = pick_size(&rng);
        live[s] = malloc(len[s]);
        if (live[s] == NULL) {
            atomic_fetch_add(&g_hammer_errors, 1);
            continue;
        }
        pattern(live[s], len[s], true);
        if (rng_next(&rng) % 8 == 0) {
            /* Keep realloc's paths busy too. */
            size_t nn = pick_size(&rng) + 1;
            void *np = realloc(live[s], nn);
            if (np == NULL) {
                atomic_fetch_add(&g_hammer_errors, 1);
                continue;
            }
            live[s] = np;
            len[s] = nn;
            pattern(np, nn, true);
        }
    }
    for (int i = 0; i < 64; i++)
        free(live[i]);
    return NULL;
}

/* Blocks the parent allocated before forking; children verify and free them. */
#define INHERITED 512
static void *g_inh[INHERITED];
static size_t g_inh_len[INHERITED];

/* ---- child side ------------------------------------------------------------ */

static void *child_thread(void *arg) {
    uint64_t rng = (uint64_t)(uintptr_t)arg;
    for (int i = 0; i < 500; i++) {
        size_t n = pick_size(&rng);
        void *p = malloc(n);
        if (p == NULL) return (void *)1;
        pattern(p, n, true);
        if (!pattern(p, n, false)) return (void *)1;
        free(p);
    }
    return NULL;
}

static int child_work(uint64_t seed, bool with_thread) {
    uint64_t rng = seed * 0x9E3779B97F4A7C15ull + 1;
    /* Inherited blocks are intact and can be freed here. */
    for (int i = 0; i < INHERITED; i++) {
        if (!pattern(g_inh[i], g_inh_len[i], false)) return CHILD_PATTERN;
        if (i % 2 == 0) free(g_inh[i]);
    }
    enum { SLOTS = 128 };
    void *live[SLOTS] = {0};
    size_t len[SLOTS] = {0};
    for (int op = 0; op < 3000; op++) {
        unsigned s = (unsigned)(rng_next(&rng) % SLOTS);
        if (live[s] != NULL) {
            if (!pattern(live[s], len[s], false)) return CHILD_PATTERN;
            if (op % 5 == 0) {
                size_t nn = pick_size(&rng) + 1, keep = nn < len[s] ? nn : len[s];
                uintptr_t oldbase = (uintptr_t)live[s];
                size_t oldn = len[s];
                unsigned char *np = realloc(live[s], nn);
                if (np == NULL) return CHILD_NULL;
                for (size_t i = 0; i < keep && i < 1024; i++)
                    if (np[i] != pat(oldbase, oldn, i)) return CHILD_PATTERN;
                live[s] = np;
                len[s] = nn;
                pattern(np, nn, true);
                continue;
            }
            free(live[s]);
        }
        len[s] = pick_size(&rng);
        live[s] = malloc(len[s]);
        if (live[s] == NULL) return CHILD_NULL;
        if ((uintptr_t)live[s] & 15) return CHILD_ALIGN;
        pattern(live[s], len[s], true);
    }
    if (with_thread) {
        /* Threads work in the child too (allocator state reset properly). */
        pthread_t t;
        void *res = (void *)1;
        if (pthread_create(&t, NULL, child_thread, (void *)(uintptr_t)(seed + 5)) != 0)
            return CHILD_THREAD;
        if (pthread_join(t, &res) != 0 || res != NULL) return CHILD_THREAD;
    }
    for (int i = 0; i < SLOTS; i++) {
        if (live[i] != NULL && !pattern(live[i], len[i], false)) return CHILD_PATTERN;
        free(live[i]);
    }
    return CHILD_OK;
}

/* Waits at most limit_ms (by the clock); on timeout kills the child and
 * returns -1. */
static int wait_bounded(pid_t pid, int *status, int64_t limit_ms) {
    for (int64_t t0 = hak_test_now_ms(); hak_test_now_ms() - t0 < limit_ms;) {
        pid_t r = waitpid(pid, status, WNOHANG);
        if (r == pid) return 0;
        if (r < 0 && errno != EINTR) return -2;
        struct timespec ts = {0, 2 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, status, 0);
    return -1;
}

/* Empty string if the child exited 0, else why not. */
static const char *child_result(pid_t pid) {
    static char msg[400];
    char limit[256];
    int st = 0;
    int r = wait_bounded(pid, &st, hak_test_limit_ms(CHILD_LIMIT_BASE_MS));
    msg[0] = 0;
    if (r == -1)
        snprintf(msg, sizeof msg, "child %d still running after %s (deadlock?)", (int)pid,
                 hak_test_limit_text(limit, sizeof limit, CHILD_LIMIT_BASE_MS));
    else if (r != 0)
        snprintf(msg, sizeof msg, "waitpid failed");
    else if (WIFSIGNALED(st))
        snprintf(msg, sizeof msg, "child killed by signal %d", WTERMSIG(st));
    else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        snprintf(msg, sizeof msg, "child exit status %d", WEXITSTATUS(st));
    return msg;
}

static void alloc_inherited(uint64_t *rng) {
    for (int i = 0; i < INHERITED; i++) {
        g_inh_len[i] = pick_size(rng);
        g_inh[i] = malloc(g_inh_len[i]);
        assert_non_null(g_inh[i]);
        pattern(g_inh[i], g_inh_len[i], true);
    }
}

static void free_inherited(void) {
    for (int i = 0; i < INHERITED; i++) {
        if (!pattern(g_inh[i], g_inh_len[i], false)) fail_msg("inherited block %d corrupted", i);
        free(g_inh[i]);
    }
}

static pthread_t g_hammers[4];

static void start_hammers(void) {
    atomic_store(&g_stop, false);
    atomic_store(&g_hammer_errors, 0);
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&g_hammers[i], NULL, hammer, (void *)(uintptr_t)(i + 1)),
                         0);
}

/* Always joins every hammer (a failing test must not leave them running). */
static void stop_hammers(void) {
    atomic_store(&g_stop, true);
    for (int i = 0; i < 4; i++)
        pthread_join(g_hammers[i], NULL);
}

static void fail_after_stopping(const char *what, int i, const char *why) {
    stop_hammers();
    fail_msg("%s %d: %s", what, i, why);
}

static void test_fork_while_threads_allocate(void **state) {
    (void)state;
    uint64_t rng = 2024;
    alloc_inherited(&rng);
    start_hammers();
    for (int i = 0; i < 50; i++) {
        /* Let the hammers get into the allocator before forking. */
        struct timespec ts = {0, 1000 * 1000};
        nanosleep(&ts, NULL);
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) _exit(child_work((uint64_t)i, i % 5 == 0));
        if (pid < 0) fail_after_stopping("fork", i, strerror(errno));
        const char *why = child_result(pid);
        if (why[0]) fail_after_stopping("fork", i, why);
    }
    stop_hammers();
    assert_int_equal(atomic_load(&g_hammer_errors), 0);
    free_inherited();
}

/* A thread other than the main one forks while the rest keep allocating. */
static atomic_int g_worker_fork_failures;
static char g_worker_fork_msg[128];

static void *forking_worker(void *arg) {
    (void)arg;
    for (int i = 0; i < 10; i++) {
        pid_t pid = fork();
        if (pid == 0) _exit(child_work((uint64_t)(100 + i), i % 3 == 0));
        if (pid < 0) {
            atomic_fetch_add(&g_worker_fork_failures, 1);
            continue;
        }
        const char *why = child_result(pid);
        if (why[0] && atomic_fetch_add(&g_worker_fork_failures, 1) == 0)
            snprintf(g_worker_fork_msg, sizeof g_worker_fork_msg, "fork %d: %s", i, why);
    }
    return NULL;
}

static void test_fork_from_other_thread(void **state) {
    (void)state;
    uint64_t rng = 77;
    alloc_inherited(&rng);
    atomic_store(&g_worker_fork_failures, 0);
    start_hammers();
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, forking_worker, NULL), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    stop_hammers();
    assert_int_equal(atomic_load(&g_hammer_errors), 0);
    free_inherited();
    if (atomic_load(&g_worker_fork_failures) != 0)
        fail_msg("%d child failure(s): %s", atomic_load(&g_worker_fork_failures),
                 g_worker_fork_msg);
}

/* A child that forks again: the fork handlers must leave the heap usable
 * for a second generation. */
static void test_nested_fork(void **state) {
    (void)state;
    uint64_t rng = 5;
    alloc_inherited(&rng);
    start_hammers();
    for (int i = 0; i < 5; i++) {
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            int rc = child_work((uint64_t)(200 + i), false);
            if (rc != CHILD_OK) _exit(rc);
            /* child_work freed half the inherited blocks; allocate them back
             * so the grandchild's check has valid blocks everywhere. */
            for (int k = 0; k < INHERITED; k += 2) {
                g_inh[k] = malloc(g_inh_len[k]);
                if (g_inh[k] == NULL) _exit(CHILD_NULL);
                pattern(g_inh[k], g_inh_len[k], true);
            }
            pid_t g = fork();
            if (g == 0) _exit(child_work((uint64_t)(300 + i), true));
            if (g < 0) _exit(6);
            int st = 0;
            /* (Within the parent's limit: the grandchild is killed first.) */
            if (wait_bounded(g, &st, hak_test_limit_ms(CHILD_LIMIT_BASE_MS) * 4 / 5) != 0 ||
                !WIFEXITED(st))
                _exit(7);
            _exit(WEXITSTATUS(st));
        }
        if (pid < 0) fail_after_stopping("fork", i, strerror(errno));
        const char *why = child_result(pid);
        if (why[0]) fail_after_stopping("nested fork", i, why);
    }
    stop_hammers();
    assert_int_equal(atomic_load(&g_hammer_errors), 0);
    free_inherited();
}

/* Fork handlers that allocate, registered before hakmem's (a priority-101
 * constructor runs before the library's): glibc runs them after hakmem's
 * prepare handler has taken every allocator lock. */
enum { EARLY_BLOCKS = 100 };
static void *g_early[EARLY_BLOCKS];
static atomic_int g_early_runs;
static void early_prepare(void) {
    for (int i = 0; i < EARLY_BLOCKS; i++)
        g_early[i] = malloc((size_t)(16 + i * 40));
}
static void early_release(void) {
    for (int i = 0; i < EARLY_BLOCKS; i++)
        free(g_early[i]);
    atomic_fetch_add(&g_early_runs, 1);
}
__attribute__((constructor(101))) static void early_register(void) {
    pthread_atfork(early_prepare, early_release, early_release);
}

static void test_fork_with_allocating_handlers(void **state) {
    (void)state;
    /* A deadlock inside fork() kills the test instead of hanging it. */
    hak_test_alarm(HANDLERS_LIMIT_BASE_MS, "test_fork_with_allocating_handlers");
    int before = atomic_load(&g_early_runs);
    for (int i = 0; i < 20; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            void *p = malloc(100);
            free(p);
            _exit(atomic_load(&g_early_runs) == before + i + 1 ? CHILD_OK : 9);
        }
        assert_true(pid > 0);
        const char *why = child_result(pid);
        if (why[0]) fail_msg("fork %d: %s", i, why);
    }
    alarm(0);
    assert_int_equal(atomic_load(&g_early_runs), before + 20);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fork_while_threads_allocate),
        cmocka_unit_test(test_fork_from_other_thread),
        cmocka_unit_test(test_nested_fork),
        cmocka_unit_test_teardown(test_fork_with_allocating_handlers, hak_test_alarm_off),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
