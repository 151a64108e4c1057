/* The program tests/check_prof.sh profiles: four functions hold known
 * amounts of memory at exit, each from a different allocation call and tier,
 * after freeing part of what they allocated; one runs in a thread of its
 * own. Prints each one's live bytes, as pprof names them, for the script to
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
    pthread_t t;
    if (pthread_create(&t, NULL, large_blocks, &large) != 0 || pthread_join(t, NULL) != 0) return 1;
    printf("small_blocks %zu\nzeroed_blocks %zu\naligned_blocks %zu\nlarge_blocks %zu\n", small,
           zeroed, aligned, large);
    if (argc > 1) {
        int (*dump)(const char *) = (int (*)(const char *))dlsym(RTLD_DEFAULT, "hak_prof_dump");
        if (dump == NULL || dump(argv[1]) != 0) {
            perror("hak_prof_dump");
            return 1;
        }
    }
    return 0;
}
