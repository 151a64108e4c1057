#include "front/report.h"

#include "box/arena.h"
#include "box/config.h"
#include "box/os.h"
#include "box/stats.h"
#include "box/usage.h"
#include "large/large.h"
#include "l25.h"
#include "pool.h"
#include "superslab/ss.h"
#include "tiny.h"

#include <unistd.h>

/* Room for the rows report_gather adds (45), and some to spare. */
#define REPORT_MAX_ROWS 64

/* Everything the stats box is handed, in storage of the caller's frame:
 * nothing here allocates. */
struct report {
    struct stats_report r;
    struct stats_class classes[TINY_NCLASSES];
    struct stats_row rows[REPORT_MAX_ROWS];
};

static void report_row(struct report *p, const char *name, uint64_t v) {
    if (p->r.nrows < REPORT_MAX_ROWS) p->rows[p->r.nrows++] = (struct stats_row){name, v};
}

static void report_gather(struct report *p) {
    struct tiny_class_stats st[TINY_NCLASSES];
    struct ss_stats t;
    struct pool_stats o;
    struct l25_stats s;
    struct large_stats l;
    struct arena_stats a;
    tiny_get_stats(st);
    ss_get_stats(&t);
    pool_get_stats(&o);
    l25_get_stats(&s);
    large_get_stats(&l);
    arena_get_stats(&a);
    p->r = (struct stats_report){
        .pid = getpid(),
        .in_use = usage_current(),
        .in_use_peak = usage_peak(),
        .mapped = os_mapped(),
        .mapped_peak = os_mapped_peak(),
        .classes = p->classes,
        .nclasses = TINY_NCLASSES,
        .rows = p->rows,
    };
    for (uint32_t c = 0; c < TINY_NCLASSES; c++)
        p->classes[c] = (struct stats_class){
            .cls = c,
            .size = small_class_size[c],
            .allocs = st[c].allocs,
            .frees = st[c].frees,
            .refills = st[c].refills,
            .flushes = st[c].flushes,
            .remote_frees = st[c].remote_frees,
            .adopted = st[c].adopted,
        };
    report_row(p, "slot.stage1_empty_same", t.stage1);
    report_row(p, "slot.stage2_unused", t.stage2);
    report_row(p, "slot.stage2_empty_other", t.stage2_reclass);
    report_row(p, "slot.stage3_cached_ss", t.stage3_cache);
    report_row(p, "slot.stage3_new_ss", t.stage3_os);
    report_row(p, "slot.releases", t.releases);
    report_row(p, "ss.live", t.live);
    report_row(p, "ss.cached", t.cached);
    report_row(p, "ss.retired", t.retired);
    report_row(p, "ss.unmapped", t.unmapped);
    report_row(p, "slot.purged", t.purged);
    report_row(p, "pool.chunks_mapped", o.chunks_mapped);
    report_row(p, "pool.chunks_unmapped", o.chunks_unmapped);
    report_row(p, "pool.bytes_mapped", o.bytes_live);
    report_row(p, "pool.carved_bytes", o.carved_bytes);
    report_row(p, "pool.remote_frees", o.remote_frees);
    report_row(p, "pool.drains", o.drains);
    report_row(p, "l25.bundles_mapped", s.bundles_mapped);
    report_row(p, "l25.bundles_unmapped", s.bundles_unmapped);
    report_row(p, "l25.bytes_mapped", s.bytes_mapped);
    report_row(p, "l25.bytes_out", s.carved_bytes);
    report_row(p, "l25.refills", s.refills);
    report_row(p, "l25.flushes", s.flushes);
    report_row(p, "l25.decommits", s.decommits);
    report_row(p, "l25.free_decommitted", s.free_decommitted);
    report_row(p, "large.allocs", l.allocs);
    report_row(p, "large.frees", l.frees);
    report_row(p, "large.cache_hits", l.cache_hits);
    report_row(p, "large.remaps_inplace", l.remaps_inplace);
    report_row(p, "large.remaps_moved", l.remaps_moved);
    report_row(p, "large.live_blocks", l.live_blocks);
    report_row(p, "large.live_bytes", l.live_bytes);
    report_row(p, "large.cached_blocks", l.cached_blocks);
    report_row(p, "large.cached_bytes", l.cached_bytes);
    report_row(p, "large.cache_decommits", l.cache_decommits);
    report_row(p, "arena.reserved_bytes", a.reserved);
    report_row(p, "arena.units_used", a.units_used);
    report_row(p, "arena.fallbacks", a.fallbacks);
    report_row(p, "os.mmap", os_calls(OS_MMAP));
    report_row(p, "os.munmap", os_calls(OS_MUNMAP));
    report_row(p, "os.madvise", os_calls(OS_MADVISE));
    report_row(p, "os.mremap", os_calls(OS_MREMAP));
    report_row(p, "os.mprotect", os_calls(OS_MPROTECT));
    report_row(p, "os.mlock", os_calls(OS_MLOCK));
}

void report_text(int fd) {
    struct report p;
    report_gather(&p);
    stats_text(fd, &p.r);
}

size_t report_json(char *buf, size_t len) {
    struct report p;
    report_gather(&p);
    return stats_json(&p.r, buf, len);
}

void report_exit(void) {
    struct report p;
    report_gather(&p);
    int fd = stats_open(hak_cfg.stats_file);
    if (hak_cfg.stats == HAK_STATS_JSON)
        stats_json_fd(fd, &p.r);
    else
        stats_text(fd, &p.r);
    if (fd != 2) close(fd);
}
