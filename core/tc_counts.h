/* A thread-cache list's counter word: what free's capacity test and the
 * countdown of malloc's next sampled allocation share, so that a pop
 * updates both with one add and a push tests one with one decrement.
 *
 *   bits     field      meaning
 *   0..15    room       blocks the list may still take: cap - count
 *   16..63   countdown  allocations of the class to pass before the next
 *                       due one (sampled for the heap profiler, and where
 *                       the Tiny statistics count allocations)
 *
 *   operation                 room     countdown   who
 *   pop (a block)             +1       -1          tc_pop: TC_POP, one add
 *   push (a block)            -1                   tc_push: room_take
 *   miss (pop found none)              -1          tc_due, on the miss path
 *   fill / take / chain      -n / +n               a tier's refill / flush
 *   capacity changed         +delta                tc_set_cap (grow, shrink)
 *   countdown re-armed                 = cd        tc_rearm, after a due one
 *
 * States of the word:
 *   room 0, cap 0            closed: the thread's first slow path has not
 *                            run yet, or its exit has (every push fails and
 *                            takes the slow path, which opens the caches
 *                            unless the thread's exit has begun)
 *   room -1                  a push found the list full (or closed): only
 *                            until that push's slow path refunds it
 *                            (tc_refund), before any pop
 *   word < 0 after a pop     the countdown was 0: this allocation is due;
 *                            the miss path puts the word back (tc_due_undo)
 *   countdown 0, armed 0     never armed: the class's first allocation
 *                            falls due at once, which arms it (no sample)
 *
 * room stays in 0..cap at a pop, so the add never carries into the
 * countdown. The countdown's start value (+1, 0 for never) is kept apart,
 * in the context's `armed`, so that what it went down by since counts the
 * class's allocations (tc_take_allocs). */
#ifndef HAK_TC_COUNTS_H
#define HAK_TC_COUNTS_H

#include "sizes.h"

#include <stdbool.h>
#include <stdint.h>

union tc_counts {
    int64_t word;
    int16_t room; /* the low 16 bits */
};

#define TC_CD_SHIFT 16
/* A pop: one more block of room, one allocation off the countdown. */
#define TC_POP ((int64_t)1 - ((int64_t)1 << TC_CD_SHIFT))
/* A countdown's longest run (with the profiler off, front_sample caps it at
 * 4096 allocations, for the thread's look at the ages). */
#define TC_CD_MAX ((int64_t)1 << 46)

/* Take d from the word; true when the result is negative. In assembly on
 * x86-64: one subtraction from memory and the sign flag, where GCC 12 spends
 * an extra instruction on the address. (Callers index the lists with a
 * size_t: a 32-bit index costs a zero extension, 2 instructions a pair.) */
HAK_INLINE bool tc_word_sub(union tc_counts *c, int64_t d) {
#if defined(__x86_64__) && defined(__GCC_ASM_FLAG_OUTPUTS__)
    bool negative;
    __asm__("subq %2, %1" : "=@ccs"(negative), "+m"(c->word) : "er"(d));
    return negative;
#else
    return (c->word -= d) < 0;
#endif
}

/* Take one from the room; true when it was 0 (now -1). In assembly for the
 * same reason. */
HAK_INLINE bool tc_word_room_take(union tc_counts *c) {
#if defined(__x86_64__) && defined(__GCC_ASM_FLAG_OUTPUTS__)
    bool negative;
    __asm__("subw $1, %1" : "=@ccs"(negative), "+m"(c->room));
    return negative;
#else
    return --c->room < 0;
#endif
}

/* The countdown (room is not negative outside a push's slow path, nor the
 * word outside a miss). */
static inline int64_t tc_word_countdown(const union tc_counts *c) {
    return c->word >> TC_CD_SHIFT;
}

/* After a due one: the countdown back at 0, and room as it was before the
 * pop that found it due, if one did (it left the countdown at -1 before the
 * miss took one more, and room one up). */
static inline void tc_word_undo_due(union tc_counts *c) {
    int64_t room = c->word & 0xffff;
    if (tc_word_countdown(c) == -2) room--;
    c->word = room;
}

/* cd more allocations on the countdown. */
static inline void tc_word_add_countdown(union tc_counts *c, int64_t cd) {
    c->word += cd * ((int64_t)1 << TC_CD_SHIFT);
}

#endif
