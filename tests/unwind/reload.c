/* The stack walker after a library is unloaded and another loaded at its
 * addresses (tests/check_unwind.sh): walks through the second must not use
 * the rules kept for the first. Each walk is compared with backtrace(); one
 * also runs on a coroutine's stack mapped below the thread's descriptor,
 * with a guard page above it, where a walk with a wrong rule would read
 * past the stack. Prints the count of walks that went wrong; exit 1 if any.
 * With --before: the same with the first library loaded before the walker
 * started (it came by dlopen: its rules too are kept by generation). */
#include "prof/unwind.h"

#include <dlfcn.h>
#include <execinfo.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdbool.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>

static int good, declined, bad;

static __attribute__((noinline)) void walk_here(void) {
    void *a[80], *b[84];
    int na = unwind_stack(a, 80);
    int nb = backtrace(b, 84);
    if (na < 0) {
        declined++;
        return;
    }
    int same = na == nb;
    for (int i = 1; same && i < na; i++)
        same = a[i] == b[i];
    if (same)
        good++;
    else
        bad++;
    __asm__ volatile("" ::: "memory");
}

typedef void f_fn(void (*)(void));

static f_fn *load(const char *path, void **h) {
    *h = dlopen(path, RTLD_NOW);
    if (*h == NULL) {
        fprintf(stderr, "reload: %s\n", dlerror());
        exit(2);
    }
    return (f_fn *)dlsym(*h, "f");
}

static f_fn *f;
static ucontext_t co, back;
static void co_body(void) {
    f(walk_here);
}

static void *on_coroutine(void *arg) {
    size_t size = 64 << 10;
    char *m = mmap(NULL, size + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED || mprotect(m + size, 4096, PROT_NONE) != 0) exit(2);
    getcontext(&co);
    co.uc_stack.ss_sp = m;
    co.uc_stack.ss_size = size;
    co.uc_link = &back;
    makecontext(&co, co_body, 0);
    swapcontext(&back, &co);
    return arg;
}

int main(int argc, char **argv) {
    bool early = argc == 4 && strcmp(argv[1], "--before") == 0;
    if (early)
        argv++;
    else if (argc != 3)
        return 2;
    void *h;
    f_fn *first = early ? load(argv[1], &h) : NULL;
    if (!unwind_start()) return 2;
    if (!early) first = load(argv[1], &h);
    first(walk_here);
    first(walk_here); /* the second walk reads the kept rules */
    dlclose(h);
    f = load(argv[2], &h);
    if (f != first) {
        fprintf(stderr, "reload: the second library did not load where the first was\n");
        return 2;
    }
    f(walk_here);
    f(walk_here);
    pthread_t t;
    if (pthread_create(&t, NULL, on_coroutine, NULL) != 0 || pthread_join(t, NULL) != 0) return 2;
    printf("walks: %d right, %d left to backtrace(), %d wrong\n", good, declined, bad);
    return bad != 0 || good < 4;
}
