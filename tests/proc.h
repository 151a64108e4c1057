/* Reading this process's /proc files in tests, without stdio (nothing
 * allocates: tests that count what the allocator does may call it). */
#ifndef HAK_TEST_PROC_H
#define HAK_TEST_PROC_H

#include <fcntl.h>
#include <sys/types.h>
#include <unistd.h>

/* The file at `path` into buf (cap bytes, NUL-terminated): its length, or
 * -1 when it cannot be opened. A file of cap - 1 bytes or more is cut
 * there (the caller can tell: the length is then cap - 1). */
static inline ssize_t proc_read(const char *path, char *buf, size_t cap) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    size_t len = 0;
    ssize_t n;
    while (len < cap - 1 && (n = read(fd, buf + len, cap - 1 - len)) > 0)
        len += (size_t)n;
    close(fd);
    buf[len] = 0;
    return (ssize_t)len;
}

#endif
