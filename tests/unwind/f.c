/* Built twice by tests/check_unwind.sh, with frames of two sizes (SZ): the
 * same code at the same offsets, but different rules for its call. */
void f(void (*cb)(void));
void f(void (*cb)(void)) {
    volatile char buf[SZ];
    buf[0] = 0;
    cb();
    buf[1] = 1;
}
