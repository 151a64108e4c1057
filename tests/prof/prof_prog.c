/* The program tests/check_prof.sh profiles: six functions hold known
 * amounts of memory at exit, each from a different allocation call and tier,
 * after freeing part of what they allocated or resizing it; one runs in a
 * thread of its own. Prints each one's live bytes, as pprof names them, for the script to
 * compare with the profile. With an argument, also calls hak_prof_dump
 * (found with dlsym: no link to hakmem) to that path before exiting. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIB ((size_t)1 << 20)

static void *held[1 << 20];
static size_t nheld;

static void hold(void *p) {
    if (p == NULL) abort();
    held[nheld++] = p;
}

/* 12 MiB in 48-byte blocks (Tiny), none freed. */
__attribute__((noinline)) static size_t small_blocks(void) {
    size_t n = 12 * MIB / 48;
    for (size_t i = 0; i < n; i++) {
        char *p = malloc(48);
        memset(p, 1, 48);
        hold(p);
    }
    return n * 48;
}

/* 48 MiB of 3000-byte calloc blocks, every other one freed: 24 MiB. */
__attribute__((noinline)) static size_t zeroed_blocks(void) {
    size_t n = 48 * MIB / 3000, kept = 0;
    void **tmp = malloc(n * sizeof *tmp);
    for (size_t i = 0; i < n; i++)
        tmp[i] = calloc(1, 3000);
    for (size_t i = 0; i < n; i++) {
        if (i % 2) {
            free(tmp[i]);
        } else {
            hold(tmp[i]);
            kept++;
        }
    }
    free(tmp);
    return kept * 3000;
}

/* 192 MiB of 100000-byte aligned blocks (L2.5), three in four freed: 48 MiB. */
__attribute__((noinline)) static size_t aligned_blocks(void) {
    size_t n = 192 * MIB / 100000, kept = 0;
    void **tmp = malloc(n * sizeof *tmp);
    for (size_t i = 0; i < n; i++)
        tmp[i] = aligned_alloc(64, 100000);
    for (size_t i = 0; i < n; i++) {
        if (i % 4) {
            free(tmp[i]);
        } else {
            hold(tmp[i]);
            kept++;
        }
    }
    free(tmp);
    return kept * 100000;
}

/* 18 MiB in blocks allocated at 390 bytes, then resized to 400 (their class
 * keeps them in place): a realloc that keeps a block keeps its sample. */
__attribute__((noinline)) static size_t resized_blocks(void) {
    size_t n = 18 * MIB / 400;
    for (size_t i = 0; i < n; i++) {
        char *p = malloc(390);
        memset(p, 2, 390);
        p = realloc(p, 400);
        if (p == NULL) abort();
        p[399] = 2;
        hold(p);
    }
    return n * 400;
}

/* 36 MiB in buffers grown by realloc from 16 bytes, doubling to 4 KiB,
 * then a step at a time: 9 of 2 MiB (4 KiB steps: in place, their pages
 * moved past their room), and 1536 of 12 KiB (1 KiB steps: Large blocks with
 * room to grow, and once too many of those are live, L2.5 blocks with room
 * for half as much again). Each sampled by its bytes, as if allocated at
 * once. (pprof names the function that calls realloc.) */
__attribute__((noinline)) static void *grown_buffer(size_t to, size_t step) {
    char *p = NULL;
    for (size_t n = 16;; n = n < 4096 ? n * 2 : n + step) {
        if (n > to) n = to;
        if ((p = realloc(p, n)) == NULL) abort();
        p[n - 1] = 3;
        if (n == to) return p;
    }
}

__attribute__((noinline)) static size_t grown_buffers(void) {
    for (int i = 0; i < 9; i++)
        hold(grown_buffer(2 * MIB, 4096));
    for (int i = 0; i < 1536; i++)
        hold(grown_buffer(12 << 10, 1024));
    return 9 * 2 * MIB + 1536 * (12 << 10);
}

/* In a thread: 3 MiB blocks (Large), 2 of 4 kept: 6 MiB. */
__attribute__((noinline)) static void *large_blocks(void *out) {
    void *b[4];
    for (int i = 0; i < 4; i++)
        b[i] = malloc(3 * MIB);
    free(b[1]);
    free(b[3]);
    hold(b[0]);
    hold(b[2]);
    *(size_t *)out = 6 * MIB;
    return NULL;
}

int main(int argc, char **argv) {
    size_t large = 0;
    size_t small = small_blocks();
    size_t zeroed = zeroed_blocks();
    size_t aligned = aligned_blocks();
    size_t resized = resized_blocks();
    size_t grown = grown_buffers();
    pthread_t t;
    if (pthread_create(&t, NULL, large_blocks, &large) != 0 || pthread_join(t, NULL) != 0) return 1;
    printf("small_blocks %zu\nzeroed_blocks %zu\naligned_blocks %zu\nlarge_blocks %zu\n"
           "resized_blocks %zu\ngrown_buffer %zu\n",
           small, zeroed, aligned, large, resized, grown);
    if (argc > 1) {
        int (*dump)(const char *) = (int (*)(const char *))dlsym(RTLD_DEFAULT, "hak_prof_dump");
        if (dump == NULL || dump(argv[1]) != 0) {
            perror("hak_prof_dump");
            return 1;
        }
    }
    return 0;
}
