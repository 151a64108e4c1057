/* The profiler's stack walker (core/prof/unwind.c) against glibc's
 * backtrace(): from frames of every shape the compiler makes (frame pointer
 * or not, alloca, a big frame, many saved registers, a call that ends its
 * function, recursion past the limit), through libc's frames, on threads'
 * stacks (a user-supplied one too), and where it may give up (a signal
 * handler, a coroutine's stack) it gives up rather than answer wrong. Each
 * walk is done twice, so the second reads the rules it kept (and replays
 * the first: the same start, the same words on the stack). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "prof/unwind.h"

#include <execinfo.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>

#define NOINLINE __attribute__((noinline))
#define MAXF     80
#ifdef __clang__ /* the sanitizer builds: frame pointers everywhere already */
#define FRAME_POINTER
#else
#define FRAME_POINTER __attribute__((optimize("no-omit-frame-pointer")))
#endif

static int compared; /* walks found equal to backtrace() */
static int declined; /* walks that gave up (-1), where that is allowed */

/* Walk from here with both and compare. The first entries are return
 * addresses into this function from two different calls; the rest must be
 * the same frames. allow_fail: the walker may give up here (it must not
 * answer wrong). */
static NOINLINE void walk_here(int allow_fail) {
    for (int round = 0; round < 2; round++) { /* the second reads kept rules */
        void *a[MAXF], *b[MAXF + 4];
        int na = unwind_stack(a, MAXF);
        int nb = backtrace(b, MAXF + 4);
        if (na < 0) {
            assert_true(allow_fail);
            declined++;
            continue;
        }
        /* backtrace() may have a frame more at the front (a sanitizer's
         * interceptor): line the two up at the first frame outside here. */
        assert_true(na >= 2);
        int k = 1;
        while (k < 3 && k < nb && b[k] != a[1])
            k++;
        assert_true(k < nb);
        if (na < MAXF) /* the whole stack: the same length */
            assert_int_equal(na - 1, nb - k);
        else
            assert_true(nb - k >= na - 1);
        for (int i = 1; i < na; i++)
            assert_ptr_equal(a[i], b[k + i - 1]);
        compared++;
    }
    __asm__ volatile("" ::: "memory"); /* not a tail call: this frame stays */
}

/* ---- frame shapes ------------------------------------------------------------- */

static NOINLINE void plain3(void) {
    walk_here(0);
    __asm__ volatile("");
}
static NOINLINE void plain2(void) {
    plain3();
    __asm__ volatile("");
}
static NOINLINE void plain1(void) {
    plain2();
    __asm__ volatile("");
}

static void test_plain_chain(void **state) {
    (void)state;
    plain1();
    assert_int_equal(compared, 2);
}

static NOINLINE int recurse(int n) {
    if (n == 0) {
        walk_here(0);
        return 0;
    }
    return recurse(n - 1) + 1; /* not a tail call */
}

/* Deeper than the limit: both stop at MAXF, with the same frames. */
static void test_recursion_past_the_limit(void **state) {
    (void)state;
    assert_int_equal(recurse(150), 150);
    assert_int_equal(compared, 2);
}

/* alloca: the CFA is kept in %rbp. */
static NOINLINE void with_alloca(size_t n) {
    volatile char *p = __builtin_alloca(n);
    p[0] = 1;
    walk_here(0);
    p[n - 1] = 2;
}

FRAME_POINTER static NOINLINE void with_fp(int n) {
    volatile int x = n;
    if (n > 0)
        with_alloca((size_t)x * 16 + 1);
    else
        walk_here(0);
    x++;
}

static NOINLINE void big_frame(void) {
    volatile char buf[200000]; /* probed as it is made: CFA offset > 64 KiB */
    buf[0] = 1;
    walk_here(0);
    buf[sizeof buf - 1] = buf[0];
}

/* Keeps many values live across the call: every callee-saved register pushed. */
static NOINLINE long many_saved(long a, long b, long c, long d, long e, long f) {
    long x1 = a * b, x2 = b * c, x3 = c * d, x4 = d * e, x5 = e * f, x6 = f * a;
    walk_here(0);
    return x1 + x2 * 3 + x3 * 5 + x4 * 7 + x5 * 11 + x6 * 13 + a + b + c + d + e + f;
}

static jmp_buf out_of_it;
static NOINLINE _Noreturn void walk_and_leave(void) {
    walk_here(0);
    longjmp(out_of_it, 1);
}
/* Its call is its last instruction: the return address is past its end, and
 * the walker must look up the address before it. */
static NOINLINE void ends_in_a_call(void) {
    walk_and_leave();
}

static NOINLINE void opaque(volatile int *sink) {
    *sink += 1;
}

/* A likely early return laid out first: its epilogue sits mid-function,
 * bracketed by remember/restore_state, before the call that walks. */
static NOINLINE int early_return(int x, volatile int *sink) {
    int a = *sink * 3, b = *sink * 5; /* kept across the calls: registers pushed */
    opaque(sink);
    if (__builtin_expect(x > 5, 1)) return a + b + *sink;
    walk_here(0);
    opaque(sink);
    return a * b + *sink;
}

static void test_frame_shapes(void **state) {
    (void)state;
    with_fp(0);
    with_fp(3);
    with_alloca(5000);
    big_frame();
    assert_true(many_saved(1, 2, 3, 4, 5, 6) > 0);
    if (setjmp(out_of_it) == 0) ends_in_a_call();
    volatile int sink = 1;
    early_return(3, &sink);
    assert_int_equal(compared, 14);
}

/* ---- the same place, other callers -------------------------------------------------
 * A walk from where the last one started, through other frames further out:
 * it must not answer the last walk's frames (the walker replays its last
 * walk when every word it read is unchanged). */

static NOINLINE void mid(void) {
    walk_here(0);
    __asm__ volatile("");
}
static NOINLINE void outer_a(void) {
    mid();
    __asm__ volatile("");
}
static NOINLINE void outer_b(void) {
    mid();
    __asm__ volatile("");
}

static void test_same_place_other_callers(void **state) {
    (void)state;
    /* The same call in the loop: each walk starts where the last one did,
     * and differs from it three frames out. */
    void (*const outer[])(void) = {outer_a, outer_b, outer_a, outer_a, outer_b};
    for (size_t i = 0; i < sizeof outer / sizeof outer[0]; i++)
        outer[i]();
    assert_int_equal(compared, 10);
}

/* ---- through libc's frames ------------------------------------------------------- */

static int cmp_walk(const void *a, const void *b) {
    static int once;
    if (!once++) walk_here(0);
    return *(const int *)a - *(const int *)b;
}

static void test_through_libc(void **state) {
    (void)state;
    int v[64];
    for (int i = 0; i < 64; i++)
        v[i] = (i * 37) % 64;
    qsort(v, 64, sizeof v[0], cmp_walk); /* qsort's own frames between */
    assert_int_equal(v[0], 0);
    assert_int_equal(compared, 2);
}

/* ---- other stacks ------------------------------------------------------------------ */

static void *thread_walk(void *arg) {
    (void)arg;
    plain1();
    return NULL;
}

static void test_thread(void **state) {
    (void)state;
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, thread_walk, NULL), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(compared, 2);
}

/* A stack the program gave: glibc puts the thread's descriptor at its top
 * all the same. */
static void test_user_stack(void **state) {
    (void)state;
    size_t size = 1 << 20;
    void *stack = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(stack != MAP_FAILED);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    assert_int_equal(pthread_attr_setstack(&attr, stack, size), 0);
    pthread_t t;
    assert_int_equal(pthread_create(&t, &attr, thread_walk, NULL), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    pthread_attr_destroy(&attr);
    munmap(stack, size);
    assert_int_equal(compared, 2);
}

static void on_signal(int sig) {
    (void)sig;
    walk_here(1);
}

/* A signal frame's rule is an expression: the walker gives up (or, where
 * the handler is called from a runtime instead, answers right). */
static void test_signal_handler(void **state) {
    (void)state;
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGUSR1, &sa, NULL);
    raise(SIGUSR1);
    signal(SIGUSR1, SIG_DFL);
    assert_int_equal(compared + declined, 2);
}

static ucontext_t co_ctx, main_ctx;
static void co_body(void) {
    walk_here(1);
}

/* A coroutine's stack: not a thread's, its top unknown; give up or be right. */
static void test_coroutine(void **state) {
    (void)state;
    static char stack[256 << 10];
    assert_int_equal(getcontext(&co_ctx), 0);
    co_ctx.uc_stack.ss_sp = stack;
    co_ctx.uc_stack.ss_size = sizeof stack;
    co_ctx.uc_link = &main_ctx;
    makecontext(&co_ctx, co_body, 0);
    assert_int_equal(swapcontext(&main_ctx, &co_ctx), 0);
    assert_int_equal(compared + declined, 2);
}

/* A walk that stops at max: the first max of the frames, and no more written. */
static NOINLINE void short_walk(void) {
    void *a[4] = {0, 0, 0, (void *)1}, *b[MAXF];
    int na = unwind_stack(a, 3);
    int nb = unwind_stack(b, MAXF); /* (checked against backtrace() above) */
    assert_int_equal(na, 3);
    assert_true(nb > 3);
    assert_ptr_equal(a[1], b[1]);
    assert_ptr_equal(a[2], b[2]);
    assert_ptr_equal(a[3], (void *)1);
    __asm__ volatile("" ::: "memory");
}

static void test_max(void **state) {
    (void)state;
    short_walk();
    assert_int_equal(unwind_stack(NULL, 0), 0);
}

static int reset(void **state) {
    (void)state;
    compared = declined = 0;
    return 0;
}

int main(void) {
    assert_true(unwind_start());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_plain_chain, reset),
        cmocka_unit_test_setup(test_recursion_past_the_limit, reset),
        cmocka_unit_test_setup(test_frame_shapes, reset),
        cmocka_unit_test_setup(test_same_place_other_callers, reset),
        cmocka_unit_test_setup(test_through_libc, reset),
        cmocka_unit_test_setup(test_thread, reset),
        cmocka_unit_test_setup(test_user_stack, reset),
        cmocka_unit_test_setup(test_signal_handler, reset),
        cmocka_unit_test_setup(test_coroutine, reset),
        cmocka_unit_test_setup(test_max, reset),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
