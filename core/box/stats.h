/* Stats: the report HAKMEM_STATS=1 prints at exit and malloc_stats() prints
 * on demand. This box only formats what it is handed and knows no tier:
 * the front's collector (core/front/report.c) gathers the counters, which
 * live in the boxes that own them. Nothing here allocates. */
#ifndef HAK_STATS_H
#define HAK_STATS_H

#include <stddef.h>
#include <stdint.h>

/* One Tiny class's line. */
struct stats_class {
    uint32_t cls, size;
    uint64_t allocs, frees, refills, flushes, remote_frees, adopted;
};

/* One counter: name "group.counter". */
struct stats_row {
    const char *name;
    uint64_t value;
};

struct stats_report {
    /* Every Tiny class; those that saw no traffic are left out. */
    const struct stats_class *classes;
    uint32_t nclasses;
    const struct stats_row *rows; /* in the text report's order */
    uint32_t nrows;
};

/* The text report, on fd. */
void stats_text(int fd, const struct stats_report *r);

#endif
