/* What the heap profiler's files share (core/prof/: prof.c keeps the
 * records, dump.c writes them out). Only core/prof/ includes it; the rest
 * of hakmem calls prof.h. */
#ifndef HAK_PROF_INTERNAL_H
#define HAK_PROF_INTERNAL_H

#include "prof/prof.h"

#include "box/lock.h"

#include <stdatomic.h>

#define PROF_DEPTH    64 /* frames kept per sample */
#define PROF_BUCKETS  4096
#define PROF_FILE_MAX 4096 /* HAKMEM_PROF_FILE with its '\0' */

struct prof_rec {
    struct prof_rec *next; /* in its bucket, or on the spare list */
    const void *p;
    /* The block's own calls change these with no lock held (prof_resize):
     * the dump reads them as they are. */
    _Atomic uint64_t n;    /* bytes asked */
    _Atomic uint64_t size; /* sampled with the probability of so many bytes
                            * (the dump scales by its inverse: no exp per
                            * sample or resize) */
    uint32_t depth;
    void *pc[PROF_DEPTH]; /* return addresses, the caller of malloc first */
};

/* The records: PROF_BUCKETS chains by address, under prof_lock. */
extern HAK_HIDDEN hak_spin prof_lock;
extern HAK_HIDDEN struct prof_rec **prof_table;
/* HAKMEM_PROF_FILE as prof_start was given it (%p not yet replaced). */
extern HAK_HIDDEN char prof_file[PROF_FILE_MAX];
/* Samples chosen but not recorded (prof_lost): said at exit. */
extern HAK_HIDDEN _Atomic uint64_t prof_n_lost;

/* A record's estimate: the allocations and bytes in use it stands for, n
 * bytes sampled with the chance of `size`. */
struct prof_est {
    uint64_t count, bytes;
};
struct prof_est prof_estimate(uint64_t n, size_t size);

#endif
