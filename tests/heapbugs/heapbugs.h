/* Shared by bugs.c and bugs_cxx.cc: the tiers, the case record, small helpers
 * and main. Plain C/C++ with no hakmem header: the programs run against any
 * allocator under LD_PRELOAD. */
#ifndef HEAPBUGS_H
#define HEAPBUGS_H

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Exit statuses. 0: the bug went unnoticed. */
#define HB_MITIGATED 42 /* the program itself saw the bug mitigated: counts as caught */
#define HB_USAGE     2  /* bad command line */
#define HB_SETUP     3  /* a malloc before the bug failed: the case did not run */

#define HB_KIB ((size_t)1024)
#define HB_MIB (1024 * HB_KIB)

/* One block size per tier (hakmem's tiers: Tiny ≤ 1 KiB, Pool 8–52 KiB,
 * L2.5 52 KiB–1 MiB, Large > 1 MiB). Each is 8 mod 16, so an allocator that
 * rounds to 16 bytes has 8 bytes of slack after the block where a canary fits.
 * The *_exact variants use a multiple of 16 (no slack). */
#define SZ_TINY  24
#define SZ_POOL  (24 * 1024 - 8)
#define SZ_L25   (256 * 1024 - 8)
#define SZ_LARGE (4 * 1024 * 1024 - 8)
#define NTIERS   4
#define NO_TIER  0u   /* tier mask of a case that has no tier */
#define ALL      0xfu /* tier mask: every tier */
#define T_TINY   1u
#define T_POOL   2u
#define T_L25    4u
#define T_LARGE  8u

static const char *const tier_names[NTIERS] = {"tiny", "pool", "l25", "large"};
static const size_t tier_sizes[NTIERS] = {SZ_TINY, SZ_POOL, SZ_L25, SZ_LARGE};
static const size_t tier_exact[NTIERS] = {32, 24 * 1024, 256 * 1024, 4 * 1024 * 1024};

/* One bug program: fn(size, arg) does the bug and returns the exit status. */
struct hb_case {
    char name[64];
    const char *kind;
    const char *tier;
    int (*fn)(size_t size, size_t arg);
    size_t size;
    size_t arg;
};

#define HB_MAX_CASES 256
static struct hb_case hb_cases[HB_MAX_CASES];
static size_t hb_ncases;

/* Appends a case named KIND[_TIER][_exact]; tier < 0: no tier. */
static void hb_add(const char *kind, int tier, int exact, int (*fn)(size_t, size_t), size_t size,
                   size_t arg) {
    struct hb_case *c = &hb_cases[hb_ncases++];
    if (tier < 0)
        snprintf(c->name, sizeof c->name, "%s", kind);
    else
        snprintf(c->name, sizeof c->name, "%s_%s%s", kind, tier_names[tier], exact ? "_exact" : "");
    c->kind = kind;
    c->tier = tier < 0 ? "-" : tier_names[tier];
    c->fn = fn;
    c->size = size;
    c->arg = arg;
}

/* Writes n bytes of v through a volatile pointer: the compiler keeps every one. */
static void fill(void *p, size_t n, int v) {
    volatile unsigned char *b = (volatile unsigned char *)p;
    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)v;
}

/* malloc that must succeed (before the bug), the block filled with 'a'. */
static char *fresh(size_t size) {
    char *p = (char *)malloc(size);
    if (!p) {
        fprintf(stderr, "heapbugs: malloc(%zu) failed before the bug\n", size);
        exit(HB_SETUP);
    }
    fill(p, size, 'a');
    return p;
}

/* After the bug: a few blocks of the same size allocated, touched and freed,
 * so an allocator that checks at malloc (or follows a corrupted list) does. */
static int churn(size_t size) {
    void *b[8];
    size_t edge = size < 16 ? size : 16;
    for (int i = 0; i < 8; i++) {
        b[i] = malloc(size);
        if (b[i]) {
            fill(b[i], edge, 'c');
            fill((char *)b[i] + size - edge, edge, 'c');
        }
    }
    for (int i = 0; i < 8; i++)
        free(b[i]);
    return 0;
}

/* bugs --list | control | CASE */
static int hb_main(int argc, char **argv, int (*control)(void)) {
    if (argc == 2 && strcmp(argv[1], "--list") == 0) {
        for (size_t i = 0; i < hb_ncases; i++)
            printf("%s\t%s\t%s\n", hb_cases[i].name, hb_cases[i].kind, hb_cases[i].tier);
        return 0;
    }
    if (argc == 2 && strcmp(argv[1], "control") == 0) return control();
    for (size_t i = 0; argc == 2 && i < hb_ncases; i++)
        if (strcmp(argv[1], hb_cases[i].name) == 0)
            return hb_cases[i].fn(hb_cases[i].size, hb_cases[i].arg);
    fprintf(stderr, "usage: %s --list | control | CASE\n", argv[0]);
    return HB_USAGE;
}

#endif
