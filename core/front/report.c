#include "front/report.h"

#include "box/config.h"
#include "box/os.h"
#include "box/stats.h"
#include "box/usage.h"
#include "front/tiers.h"
#include "sizeclass.h"

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

static void report_gather(struct report *p) {
    struct tier_stats s = {.rows = p->rows, .max_rows = REPORT_MAX_ROWS, .classes = p->classes};
    tiers_stats(&s);
    p->r = (struct stats_report){
        .pid = getpid(),
        .in_use = usage_current(),
        .in_use_peak = usage_peak(),
        .mapped = os_mapped(),
        .mapped_peak = os_mapped_peak(),
        .classes = p->classes,
        .nclasses = s.nclasses,
        .rows = p->rows,
        .nrows = s.nrows,
    };
}

void report_text(int fd) {
    struct report p = {0}; /* (zeroed: what the tiers do not fill) */
    report_gather(&p);
    stats_text(fd, &p.r);
}

size_t report_json(char *buf, size_t len) {
    struct report p = {0}; /* (zeroed: what the tiers do not fill) */
    report_gather(&p);
    return stats_json(&p.r, buf, len);
}

void report_exit(void) {
    struct report p = {0}; /* (zeroed: what the tiers do not fill) */
    report_gather(&p);
    int fd = stats_open(hak_cfg.stats_file);
    if (hak_cfg.stats == HAK_STATS_JSON)
        stats_json_fd(fd, &p.r);
    else
        stats_text(fd, &p.r);
    if (fd != 2) close(fd);
}
