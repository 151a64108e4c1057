#include "box/stats.h"

#include "box/arena.h"
#include "box/diag.h"
#include "box/os.h"
#include "large.h"
#include "pool.h"
#include "l25.h"
#include "superslab/ss.h"
#include "tiny.h"

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

/* One row per Tiny class that saw any traffic. */
static void stats_tiny(int fd) {
    struct tiny_class_stats st[TINY_NCLASSES];
    tiny_get_stats(st);
    struct diag_buf b = {.n = 0};
    diag_str(&b, "hakmem:   tiny class   size        allocs         frees   refills   flushes"
                 "  remote_frees  adopted\n");
    diag_flush(&b, fd);
    for (uint32_t c = 0; c < TINY_NCLASSES; c++) {
        const struct tiny_class_stats *t = &st[c];
        if ((t->allocs | t->frees | t->refills | t->remote_frees) == 0) continue;
        diag_str(&b, "hakmem:   ");
        diag_u64w(&b, c, 10);
        diag_u64w(&b, small_class_size[c], 7);
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

void stats_print(int fd) {
    struct l25_stats s;
    struct large_stats l;
    struct ss_stats t;
    l25_get_stats(&s);
    large_get_stats(&l);
    ss_get_stats(&t);
    struct diag_buf b = {.n = 0};
    diag_str(&b, "hakmem: stats (allocs/frees: exited threads and this one)\n");
    diag_flush(&b, fd);
    stats_tiny(fd);
    stats_line(fd, "slot.stage1_empty_same", t.stage1);
    stats_line(fd, "slot.stage2_unused", t.stage2);
    stats_line(fd, "slot.stage2_empty_other", t.stage2_reclass);
    stats_line(fd, "slot.stage3_cached_ss", t.stage3_cache);
    stats_line(fd, "slot.stage3_new_ss", t.stage3_os);
    stats_line(fd, "slot.releases", t.releases);
    stats_line(fd, "ss.live", t.live);
    stats_line(fd, "ss.cached", t.cached);
    stats_line(fd, "ss.retired", t.retired);
    stats_line(fd, "ss.unmapped", t.unmapped);
    stats_line(fd, "slot.purged", t.purged);
    struct pool_stats o;
    pool_get_stats(&o);
    stats_line(fd, "pool.chunks_mapped", o.chunks_mapped);
    stats_line(fd, "pool.chunks_unmapped", o.chunks_unmapped);
    stats_line(fd, "pool.bytes_mapped", o.bytes_live);
    stats_line(fd, "pool.carved_bytes", o.carved_bytes);
    stats_line(fd, "pool.remote_frees", o.remote_frees);
    stats_line(fd, "pool.drains", o.drains);
    stats_line(fd, "l25.bundles_mapped", s.bundles_mapped);
    stats_line(fd, "l25.bundles_unmapped", s.bundles_unmapped);
    stats_line(fd, "l25.bytes_mapped", s.bytes_mapped);
    stats_line(fd, "l25.bytes_out", s.carved_bytes);
    stats_line(fd, "l25.refills", s.refills);
    stats_line(fd, "l25.flushes", s.flushes);
    stats_line(fd, "l25.decommits", s.decommits);
    stats_line(fd, "l25.free_decommitted", s.free_decommitted);
    stats_line(fd, "large.allocs", l.allocs);
    stats_line(fd, "large.frees", l.frees);
    stats_line(fd, "large.cache_hits", l.cache_hits);
    stats_line(fd, "large.remaps_inplace", l.remaps_inplace);
    stats_line(fd, "large.remaps_moved", l.remaps_moved);
    stats_line(fd, "large.live_blocks", l.live_blocks);
    stats_line(fd, "large.live_bytes", l.live_bytes);
    stats_line(fd, "large.cached_blocks", l.cached_blocks);
    stats_line(fd, "large.cached_bytes", l.cached_bytes);
    stats_line(fd, "large.cache_decommits", l.cache_decommits);
    struct arena_stats a;
    arena_get_stats(&a);
    stats_line(fd, "arena.reserved_bytes", a.reserved);
    stats_line(fd, "arena.units_used", a.units_used);
    stats_line(fd, "arena.fallbacks", a.fallbacks);
    stats_line(fd, "os.mmap", os_calls(OS_MMAP));
    stats_line(fd, "os.munmap", os_calls(OS_MUNMAP));
    stats_line(fd, "os.madvise", os_calls(OS_MADVISE));
    stats_line(fd, "os.mremap", os_calls(OS_MREMAP));
    stats_line(fd, "os.mprotect", os_calls(OS_MPROTECT));
    stats_line(fd, "os.mlock", os_calls(OS_MLOCK));
}
