/* Stats: the report HAKMEM_STATS prints at exit, malloc_stats() prints and
 * hak_stats_json returns, as text or JSON. This box only formats what it is
 * handed and knows no tier: the front's collector (core/front/report.c)
 * gathers the counters, which live in the boxes that own them. Nothing here
 * allocates. */
#ifndef HAK_STATS_H
#define HAK_STATS_H

#include <stddef.h>
#include <stdint.h>

/* One Tiny class's line. */
struct stats_class {
    uint32_t cls, size;
    uint64_t allocs, frees, refills, flushes, remote_frees, adopted;
};

/* One counter: name "group.counter" (the text report's name; in JSON the
 * counter of object "group"). */
struct stats_row {
    const char *name;
    uint64_t value;
};

struct stats_report {
    int pid;
    uint64_t in_use, in_use_peak; /* bytes (box/usage.h) */
    uint64_t mapped, mapped_peak; /* bytes (os_mapped) */
    /* Every Tiny class; those that saw no traffic are left out. */
    const struct stats_class *classes;
    uint32_t nclasses;
    const struct stats_row *rows; /* in the text report's order */
    uint32_t nrows;
};

/* The text report, on fd. */
void stats_text(int fd, const struct stats_report *r);
/* The JSON object into buf, with snprintf's contract: returns the length
 * of the whole object (without the NUL) and stores at most len bytes,
 * NUL-terminated when len > 0. */
size_t stats_json(const struct stats_report *r, char *buf, size_t len);
/* The JSON object on fd, and a newline. */
void stats_json_fd(int fd, const struct stats_report *r);

/* The descriptor the report at exit goes to: the file `path` (created or
 * truncated), or 2 when path is NULL or the file cannot be opened (one
 * line on 2 then says so). */
int stats_open(const char *path);

#endif
