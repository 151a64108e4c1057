/* Death tests: run a function in a forked child with its stderr captured,
 * bounded in time, so a test can assert how hakmem rejected bad input (the
 * signal and the exact message). Include after <cmocka.h>: it asserts. */
#ifndef HAK_TEST_DEATH_H
#define HAK_TEST_DEATH_H

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <stdlib.h>
#include <unistd.h>

#include "timing.h"

/* A child still running after this (scaled: tests/timing.h) is killed as
 * hung. The slowest child takes 1.4 s in the debug build (test_background's
 * burst; test_large's sampled mappings 1.2 s, 10.2 s under TSan, 14 s on a
 * slower machine), 3.3 s under UBSan: 30 s is over 20 times that in every
 * build once scaled (UBSan 60 s, TSan 300 s). It was a fixed 10 s (issue
 * 29). */
#define DEATH_LIMIT_BASE_MS 30000

/* In a child (run_child, expect_clean_exit): a failed check says where and
 * ends the child with status 1 (cmocka's asserts are the parent's). */
#define CHILD_CHECK(c)                                                                             \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "%s:%d: failed: %s\n", __FILE__, __LINE__, #c);                        \
            _exit(1);                                                                              \
        }                                                                                          \
    } while (0)

struct death {
    int status;    /* waitpid status */
    bool timedout; /* child killed by us, after DEATH_LIMIT_BASE_MS scaled */
    char err[8192];
    size_t len;
};

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Runs fn(arg) in a child whose stderr is captured into d->err. */
static void run_child(void (*fn)(void *), void *arg, struct death *d) {
    int fd[2];
    assert_int_equal(pipe(fd), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* cmocka traps some signals; the child must die the default way. */
        const int sigs[] = {SIGABRT, SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGSYS};
        for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
            signal(sigs[i], SIG_DFL);
        struct rlimit no_core = {0, 0};
        setrlimit(RLIMIT_CORE, &no_core);
        close(fd[0]);
        dup2(fd[1], 2);
        close(fd[1]);
        fn(arg);
        _exit(0);
    }
    close(fd[1]);
    memset(d, 0, sizeof *d);
    int64_t deadline = now_ms() + hak_test_limit_ms(DEATH_LIMIT_BASE_MS);
    for (;;) {
        int64_t left = deadline - now_ms();
        if (left <= 0) {
            d->timedout = true;
            kill(pid, SIGKILL);
            break;
        }
        struct pollfd p = {.fd = fd[0], .events = POLLIN, .revents = 0};
        int r = poll(&p, 1, (int)left);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) continue;
        ssize_t n = read(fd[0], d->err + d->len, sizeof d->err - 1 - d->len);
        if (n <= 0) break; /* EOF: the child is gone (or closed stderr) */
        d->len += (size_t)n;
        if (d->len == sizeof d->err - 1) break;
    }
    close(fd[0]);
    /* Bounded wait: stderr may close before the child is fully dead. */
    for (;;) {
        pid_t w = waitpid(pid, &d->status, WNOHANG);
        if (w == pid) break;
        if (now_ms() > deadline) {
            d->timedout = true;
            kill(pid, SIGKILL);
            waitpid(pid, &d->status, 0);
            break;
        }
        struct timespec ts = {0, 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    d->err[d->len] = 0;
}

/* Counts lines of d->err that are `line`, alone or followed by a detail in
 * parentheses (" (block of 32 bytes, tiny tier)"), and lines starting
 * "hakmem:". */
static inline void count_lines(const struct death *d, const char *line, int *exact, int *hakmem) {
    *exact = *hakmem = 0;
    const char *s = d->err;
    size_t len = strlen(line);
    while (*s) {
        const char *e = strchr(s, '\n');
        size_t n = e ? (size_t)(e - s) : strlen(s);
        if (n >= len && memcmp(s, line, len) == 0 &&
            (n == len || (n > len + 2 && memcmp(s + len, " (", 2) == 0 && s[n - 1] == ')')))
            (*exact)++;
        if (n >= 7 && memcmp(s, "hakmem:", 7) == 0) (*hakmem)++;
        s += n + (e != NULL);
    }
}

/* Fails the test if the child was killed as hung, naming the limit. */
static inline void assert_not_hung(const struct death *d) {
    char limit[256];
    if (d->timedout)
        fail_msg("child hung: killed after %s; stderr: %s",
                 hak_test_limit_text(limit, sizeof limit, DEATH_LIMIT_BASE_MS), d->err);
}

static inline void assert_aborted(const struct death *d) {
    assert_not_hung(d);
    if (!WIFSIGNALED(d->status))
        fail_msg("child did not die from a signal (exit %d); stderr: %s", WEXITSTATUS(d->status),
                 d->err);
    if (WTERMSIG(d->status) != SIGABRT)
        fail_msg("child died from signal %d, not SIGABRT; stderr: %s", WTERMSIG(d->status), d->err);
}

/* The child must abort, printing exactly `expected` and no other hakmem line. */
/* fn(arg) must run to its end in a child: exit status 0, nothing on stderr. */
static inline void expect_clean_exit(void (*fn)(void *), void *arg) {
    struct death d;
    run_child(fn, arg, &d);
    assert_not_hung(&d);
    if (!WIFEXITED(d.status) || WEXITSTATUS(d.status) != 0)
        fail_msg("valid use failed: status 0x%x; stderr: %s", d.status, d.err);
    assert_int_equal(d.len, 0);
}

static inline void expect_death(void (*fn)(void *), void *arg, const char *expected) {
    struct death d;
    run_child(fn, arg, &d);
    assert_aborted(&d);
    int exact, hak;
    count_lines(&d, expected, &exact, &hak);
    if (exact != 1 || hak != 1)
        fail_msg("expected exactly one line \"%s\"; stderr was:\n%s", expected, d.err);
}

/* fn(p) in a child must abort with the one line "hakmem: free(): <what> <p>". */
static inline void expect_free_abort(void (*fn)(void *), void *p, const char *what) {
    char line[160];
    snprintf(line, sizeof line, "hakmem: free(): %s %p", what, p);
    expect_death(fn, p, line);
}

/* In a run_child child: this test program again, as `<self> mode` (its
 * main's own mode, a fresh process: nothing of the parent's allocator state
 * carried over); exits 20 or 21 when that cannot be. */
static inline void exec_self_as(const char *mode) {
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) _exit(20);
    self[n] = 0;
    char *argv[] = {self, (char *)mode, NULL};
    execv(self, argv);
    _exit(21);
}

/* Pointers travel through a volatile so the compiler cannot diagnose or
 * fold the deliberately bad calls. */
static inline void do_free(void *p) {
    void *volatile v = p;
    free(v);
}

static inline void do_double_free(void *p) {
    void *volatile v = p;
    free(v);
    free(v);
}

#endif
