/* Report: the front's stats collector. It gathers each tier's and box's
 * counters (calling down into them, which the stats box may not) and hands
 * them to the stats box (box/stats.h), which formats them. */
#ifndef HAK_REPORT_H
#define HAK_REPORT_H

#include <stddef.h>

/* The text report on fd (malloc_stats). */
void report_text(int fd);
/* At exit (HAKMEM_STATS=1), on stderr. */
void report_exit(void);

#endif
