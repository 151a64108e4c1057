#include "box/stats.h"

#include "box/diag.h"

#include <string.h>

static void stats_line(int fd, const char *name, uint64_t v) {
    struct diag_buf b = {.n = 0};
    diag_str(&b, "hakmem:   ");
    diag_str(&b, name);
    for (size_t len = strlen(name); len < 24; len++)
        diag_str(&b, " ");
    diag_u64w(&b, v, 16);
    diag_str(&b, "\n");
    diag_flush(&b, fd);
}

static bool stats_class_used(const struct stats_class *t) {
    return (t->allocs | t->frees | t->refills | t->remote_frees) != 0;
}

/* One row per Tiny class that saw any traffic. */
static void stats_tiny(int fd, const struct stats_report *r) {
    struct diag_buf b = {.n = 0};
    diag_str(&b, "hakmem:   tiny class   size        allocs         frees   refills   flushes"
                 "  remote_frees  adopted\n");
    diag_flush(&b, fd);
    for (uint32_t i = 0; i < r->nclasses; i++) {
        const struct stats_class *t = &r->classes[i];
        if (!stats_class_used(t)) continue;
        diag_str(&b, "hakmem:   ");
        diag_u64w(&b, t->cls, 10);
        diag_u64w(&b, t->size, 7);
        diag_u64w(&b, t->allocs, 14);
        diag_u64w(&b, t->frees, 14);
        diag_u64w(&b, t->refills, 10);
        diag_u64w(&b, t->flushes, 10);
        diag_u64w(&b, t->remote_frees, 14);
        diag_u64w(&b, t->adopted, 9);
        diag_str(&b, "\n");
        diag_flush(&b, fd);
    }
}

void stats_text(int fd, const struct stats_report *r) {
    struct diag_buf b = {.n = 0};
    diag_str(&b, "hakmem: stats (allocs/frees: exited threads and this one)\n");
    diag_flush(&b, fd);
    stats_tiny(fd, r);
    for (uint32_t i = 0; i < r->nrows; i++)
        stats_line(fd, r->rows[i].name, r->rows[i].value);
}
