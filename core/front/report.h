/* Report: the front's stats collector. It gathers each tier's and box's
 * counters (calling down into them, which the stats box may not) and hands
 * them to the stats box (box/stats.h), which formats them. */
#ifndef HAK_REPORT_H
#define HAK_REPORT_H

#include <stddef.h>

/* The text report on fd (malloc_stats). */
void report_text(int fd);
/* The JSON object into buf, with snprintf's contract (hak_stats_json). */
size_t report_json(char *buf, size_t len);
/* At exit, as HAKMEM_STATS and HAKMEM_STATS_FILE say. */
void report_exit(void);

#endif
