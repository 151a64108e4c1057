#include "box/stats.h"

#include "box/diag.h"
#include "hakmem.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>

/* ---- text -------------------------------------------------------------------------- */

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

static bool stats_class_used(const struct stats_class *t) {
    return (t->allocs | t->frees | t->refills | t->remote_frees) != 0;
}

/* One row per Tiny class that saw any traffic. */
static void stats_tiny(int fd, const struct stats_report *r) {
    struct diag_buf b = {.n = 0};
    diag_str(&b, "hakmem:   tiny class   size        allocs         frees   refills   flushes"
                 "  remote_frees  adopted\n");
    diag_flush(&b, fd);
    for (uint32_t i = 0; i < r->nclasses; i++) {
        const struct stats_class *t = &r->classes[i];
        if (!stats_class_used(t)) continue;
        diag_str(&b, "hakmem:   ");
        diag_u64w(&b, t->cls, 10);
        diag_u64w(&b, t->size, 7);
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

void stats_text(int fd, const struct stats_report *r) {
    struct diag_buf b = {.n = 0};
    diag_str(&b, "hakmem: stats (allocs/frees: exited threads and this one)\n");
    diag_flush(&b, fd);
    stats_tiny(fd, r);
    for (uint32_t i = 0; i < r->nrows; i++)
        stats_line(fd, r->rows[i].name, r->rows[i].value);
}

/* ---- JSON -------------------------------------------------------------------------- */

/* Where JSON goes: a caller's buffer (fd < 0), or a descriptor through a
 * line buffer. n counts every byte produced, stored or not. */
struct stats_out {
    char *buf;
    size_t len, n;
    int fd;
    struct diag_buf pend;
};

static void stats_put(struct stats_out *o, const char *s) {
    for (; *s; s++, o->n++) {
        if (o->fd < 0) {
            if (o->n + 1 < o->len) o->buf[o->n] = *s;
            continue;
        }
        if (o->pend.n == sizeof o->pend.s) diag_flush(&o->pend, o->fd);
        o->pend.s[o->pend.n++] = *s;
    }
}

static void stats_put_u64(struct stats_out *o, uint64_t v) {
    char tmp[24];
    int i = (int)sizeof tmp - 1;
    tmp[i] = '\0';
    do {
        tmp[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    stats_put(o, tmp + i);
}

/* ,"key": (no comma when first), the key the first keylen bytes of `key`.
 * Keys are the report's own names: none needs escaping. */
static void stats_key(struct stats_out *o, bool first, const char *key, size_t keylen) {
    char k[64];
    if (keylen >= sizeof k) keylen = sizeof k - 1;
    memcpy(k, key, keylen);
    k[keylen] = '\0';
    stats_put(o, first ? "\"" : ",\"");
    stats_put(o, k);
    stats_put(o, "\":");
}

static void stats_field(struct stats_out *o, bool first, const char *key, uint64_t v) {
    stats_key(o, first, key, strlen(key));
    stats_put_u64(o, v);
}

/* ,"name":{"current":current,"peak":peak} */
static void stats_pair(struct stats_out *o, const char *name, uint64_t current, uint64_t peak) {
    stats_key(o, false, name, strlen(name));
    stats_put(o, "{");
    stats_field(o, true, "current", current);
    stats_field(o, false, "peak", peak);
    stats_put(o, "}");
}

static void stats_json_classes(struct stats_out *o, const struct stats_report *r) {
    stats_put(o, ",\"tiny\":{\"classes\":[");
    bool first = true;
    for (uint32_t i = 0; i < r->nclasses; i++) {
        const struct stats_class *t = &r->classes[i];
        if (!stats_class_used(t)) continue;
        stats_put(o, first ? "{" : ",{");
        first = false;
        stats_field(o, true, "class", t->cls);
        stats_field(o, false, "size", t->size);
        stats_field(o, false, "allocs", t->allocs);
        stats_field(o, false, "frees", t->frees);
        stats_field(o, false, "refills", t->refills);
        stats_field(o, false, "flushes", t->flushes);
        stats_field(o, false, "remote_frees", t->remote_frees);
        stats_field(o, false, "adopted", t->adopted);
        stats_put(o, "}");
    }
    stats_put(o, "]}");
}

/* The length of the group part of a row's name ("pool" of "pool.drains"). */
static size_t stats_group_len(const char *name) {
    const char *dot = strchr(name, '.');
    return dot ? (size_t)(dot - name) : strlen(name);
}

static bool stats_same_group(const char *a, const char *b) {
    size_t n = stats_group_len(a);
    return n == stats_group_len(b) && memcmp(a, b, n) == 0;
}

/* An object per group, in the order groups first appear; each holds its
 * rows in their order (a group's rows need not be next to each other). */
static void stats_json_rows(struct stats_out *o, const struct stats_report *r) {
    for (uint32_t i = 0; i < r->nrows; i++) {
        const char *name = r->rows[i].name;
        bool seen = false;
        for (uint32_t j = 0; j < i && !seen; j++)
            seen = stats_same_group(r->rows[j].name, name);
        if (seen) continue;
        size_t g = stats_group_len(name);
        stats_key(o, false, name, g);
        stats_put(o, "{");
        bool first = true;
        for (uint32_t k = i; k < r->nrows; k++) {
            const char *kn = r->rows[k].name;
            if (!stats_same_group(kn, name)) continue;
            const char *key = kn[g] == '.' ? kn + g + 1 : kn;
            stats_field(o, first, key, r->rows[k].value);
            first = false;
        }
        stats_put(o, "}");
    }
}

static void stats_json_object(struct stats_out *o, const struct stats_report *r) {
    stats_put(o, "{\"version\":\"" HAKMEM_VERSION "\"");
    stats_field(o, false, "pid", r->pid < 0 ? 0 : (uint64_t)r->pid);
    stats_pair(o, "in_use", r->in_use, r->in_use_peak);
    stats_pair(o, "mapped", r->mapped, r->mapped_peak);
    stats_json_classes(o, r);
    stats_json_rows(o, r);
    stats_put(o, "}");
}

size_t stats_json(const struct stats_report *r, char *buf, size_t len) {
    struct stats_out o = {.buf = buf, .len = buf ? len : 0, .fd = -1};
    stats_json_object(&o, r);
    if (o.len > 0) buf[o.n < len ? o.n : len - 1] = '\0';
    return o.n;
}

void stats_json_fd(int fd, const struct stats_report *r) {
    struct stats_out o = {.fd = fd, .pend = {.n = 0}};
    stats_json_object(&o, r);
    stats_put(&o, "\n");
    diag_flush(&o.pend, fd);
}

/* ---- where the report at exit goes ---------------------------------------------------- */

int stats_open(const char *path) {
    if (path == NULL) return 2;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) return fd;
    const char *why = strerrorname_np(errno);
    struct diag_buf b = {.n = 0};
    diag_str(&b, "hakmem: cannot open HAKMEM_STATS_FILE '");
    /* (A long path in part: the line must fit the buffer, newline and all.) */
    for (size_t i = 0; path[i] != '\0' && b.n < 400; i++)
        b.s[b.n++] = path[i];
    if (strlen(path) > 400) diag_str(&b, "...");
    diag_str(&b, "' (");
    if (why != NULL)
        diag_str(&b, why);
    else
        diag_u64(&b, (uint64_t)errno);
    diag_str(&b, "); the stats go to stderr\n");
    diag_flush(&b, 2);
    return 2;
}
