/* Stats: the summary HAKMEM_STATS=1 prints at exit and malloc_stats() prints
 * on demand. Counters live in the boxes that own them (all on slow paths);
 * this box only gathers and formats them. */
#ifndef HAK_STATS_H
#define HAK_STATS_H

void stats_print(int fd);

#endif
