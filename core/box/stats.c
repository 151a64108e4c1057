#include "box/stats.h"

#include "box/diag.h"
#include "box/os.h"
#include "large.h"
#include "small.h"

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

void stats_print(int fd) {
    struct small_stats s;
    struct large_stats l;
    small_get_stats(&s);
    large_get_stats(&l);
    struct diag_buf b = {.n = 0};
    diag_str(&b, "hakmem: stats\n");
    diag_flush(&b, fd);
    stats_line(fd, "small.regions", s.regions);
    stats_line(fd, "small.carved_bytes", s.carved_bytes);
    stats_line(fd, "small.refills", s.refills);
    stats_line(fd, "small.flushes", s.flushes);
    stats_line(fd, "large.allocs", l.allocs);
    stats_line(fd, "large.frees", l.frees);
    stats_line(fd, "large.cache_hits", l.cache_hits);
    stats_line(fd, "large.remaps_inplace", l.remaps_inplace);
    stats_line(fd, "large.remaps_moved", l.remaps_moved);
    stats_line(fd, "large.live_blocks", l.live_blocks);
    stats_line(fd, "large.live_bytes", l.live_bytes);
    stats_line(fd, "large.cached_blocks", l.cached_blocks);
    stats_line(fd, "large.cached_bytes", l.cached_bytes);
    stats_line(fd, "os.mmap", os_calls(OS_MMAP));
    stats_line(fd, "os.munmap", os_calls(OS_MUNMAP));
    stats_line(fd, "os.madvise", os_calls(OS_MADVISE));
    stats_line(fd, "os.mremap", os_calls(OS_MREMAP));
}
