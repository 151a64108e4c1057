/* hakmem [OPTION]... [--] PROGRAM [ARG]...: runs PROGRAM with the hakmem
 * library preloaded (docs/hakmem.1). It sets environment variables and execs
 * PROGRAM, so the exit status (death by a signal included) is PROGRAM's own,
 * and this command is never itself run on the library.
 *
 * The library is found relative to this command's own file: HAKMEM_LIBDIR_REL
 * from its directory (the installed layout, PREFIX/bin -> PREFIX/lib), else
 * next to it (the build tree, out/release). The Makefile passes
 * HAKMEM_VERSION, HAKMEM_SONAME and HAKMEM_LIBDIR_REL. */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <unistd.h>

#if !defined(HAKMEM_VERSION) || !defined(HAKMEM_SONAME) || !defined(HAKMEM_LIBDIR_REL)
#error "build with the Makefile: it defines HAKMEM_VERSION, HAKMEM_SONAME, HAKMEM_LIBDIR_REL"
#endif

/* Exit statuses of our own (otherwise the status is PROGRAM's), as env(1). */
enum {
    EXIT_USAGE = 2,        /* bad command line */
    EXIT_FAILED = 125,     /* this command failed (library not found, ...) */
    EXIT_CANNOT_RUN = 126, /* PROGRAM found but not executable */
    EXIT_NOT_FOUND = 127,  /* PROGRAM not found */
};

static const char usage_text[] =
    "Usage: hakmem [OPTION]... [--] PROGRAM [ARG]...\n"
    "Run PROGRAM with the hakmem memory allocator preloaded (LD_PRELOAD).\n"
    "\n"
    "  --stats          print allocator statistics on stderr at exit (HAKMEM_STATS=1)\n"
    "  --stats=json     print them as one JSON object (HAKMEM_STATS=json)\n"
    "  --check          checked mode: report overflows, writes after free, bad frees\n"
    "                   (HAKMEM_CHECK=1)\n"
    "  --profile FILE   write a heap profile to FILE at exit, %p in FILE standing\n"
    "  --profile=FILE   for the process id (HAKMEM_PROF=1, HAKMEM_PROF_FILE=FILE)\n"
    "  --background     give free memory back from a background thread\n"
    "                   (HAKMEM_BACKGROUND=1)\n"
    "  --help           print this help and exit\n"
    "  --version        print the version and exit\n"
    "\n"
    "Options end at -- or at the first argument that is not an option. They are\n"
    "environment variables, so programs that PROGRAM runs inherit them.\n"
    "Exit status: PROGRAM's; 2 for a bad option, 125 if hakmem itself fails,\n"
    "126 if PROGRAM cannot be run, 127 if it is not found. See hakmem(1).\n";

/* "hakmem: <message>" and a newline on stderr. */
__attribute__((format(printf, 1, 0))) static void message(const char *fmt, va_list ap) {
    fputs("hakmem: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
}

__attribute__((format(printf, 1, 2))) static _Noreturn void usage_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    message(fmt, ap);
    va_end(ap);
    fputs("Try 'hakmem --help' for more information.\n", stderr);
    exit(EXIT_USAGE);
}

__attribute__((format(printf, 1, 2))) static _Noreturn void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    message(fmt, ap);
    va_end(ap);
    exit(EXIT_FAILED);
}

/* Prints text on stdout and exits 0, or 125 if it could not be written. */
static _Noreturn void print_and_exit(const char *text) {
    fputs(text, stdout);
    if (fflush(stdout) != 0 || ferror(stdout)) fail("cannot write to stdout: %s", strerror(errno));
    exit(0);
}

/* This command's directory, symlinks resolved, into dir (PATH_MAX bytes):
 * /proc/self/exe, or where /proc is not mounted the path it was run by. */
static bool self_dir(char *dir) {
    ssize_t n = readlink("/proc/self/exe", dir, PATH_MAX - 1);
    if (n > 0) {
        dir[n] = '\0';
    } else {
        const char *execfn = (const char *)getauxval(AT_EXECFN);
        if (execfn == NULL || realpath(execfn, dir) == NULL) return false;
    }
    char *slash = strrchr(dir, '/');
    if (slash == NULL) return false;
    *slash = '\0';
    return true;
}

/* The library's path into lib (PATH_MAX bytes): in dir/HAKMEM_LIBDIR_REL,
 * else in dir itself; false if in neither. */
static bool find_library(const char *dir, char *lib) {
    const char *subdirs[] = {"/" HAKMEM_LIBDIR_REL, ""};
    for (size_t i = 0; i < sizeof subdirs / sizeof subdirs[0]; i++) {
        char path[PATH_MAX], real[PATH_MAX];
        int n = snprintf(path, sizeof path, "%s%s", dir, subdirs[i]);
        if (n < 0 || (size_t)n >= sizeof path || realpath(path, real) == NULL) continue;
        n = snprintf(lib, PATH_MAX, "%s/%s", strcmp(real, "/") == 0 ? "" : real, HAKMEM_SONAME);
        if (n < 0 || n >= PATH_MAX) continue;
        if (access(lib, R_OK) == 0) return true;
    }
    return false;
}

static void set_env(const char *name, const char *value) {
    if (setenv(name, value, 1) != 0) fail("cannot set the environment: %s", strerror(errno));
}

int main(int argc, char **argv) {
    const char *stats = NULL, *profile = NULL;
    bool check = false, background = false;
    int i = 1;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        if (a[0] != '-' || a[1] == '\0') break; /* PROGRAM ("-" is not an option) */
        if (strcmp(a, "--help") == 0) {
            print_and_exit(usage_text);
        } else if (strcmp(a, "--version") == 0) {
            print_and_exit("hakmem " HAKMEM_VERSION "\n");
        } else if (strcmp(a, "--stats") == 0) {
            stats = "1";
        } else if (strcmp(a, "--stats=json") == 0) {
            stats = "json";
        } else if (strncmp(a, "--stats=", 8) == 0) {
            usage_error("'%s': --stats takes no value or =json", a);
        } else if (strcmp(a, "--check") == 0) {
            check = true;
        } else if (strcmp(a, "--profile") == 0) {
            if (i + 1 >= argc) usage_error("option '%s' needs a file name", a);
            profile = argv[++i];
        } else if (strncmp(a, "--profile=", 10) == 0) {
            profile = a + 10;
        } else if (strcmp(a, "--background") == 0) {
            background = true;
        } else {
            usage_error("unrecognized option '%s'", a);
        }
        if (profile != NULL && profile[0] == '\0')
            usage_error("option '%s' needs a file name", "--profile");
    }
    if (i >= argc) usage_error("no program given");

    char dir[PATH_MAX], lib[PATH_MAX];
    if (!self_dir(dir)) fail("cannot find my own file: %s", strerror(errno));
    if (!find_library(dir, lib))
        fail("cannot find " HAKMEM_SONAME " in %s/" HAKMEM_LIBDIR_REL " or beside it", dir);
    /* ld.so splits LD_PRELOAD at spaces and colons: such a path cannot be in it. */
    if (strpbrk(lib, " :") != NULL) fail("cannot preload '%s': its path has a space or colon", lib);

    /* Ours first, then whatever was there (space or colon separated, as is). */
    const char *old = getenv("LD_PRELOAD");
    if (old != NULL && old[0] != '\0') {
        size_t len = strlen(lib) + 1 + strlen(old) + 1;
        char *preload = malloc(len);
        if (preload == NULL) fail("cannot set LD_PRELOAD: %s", strerror(errno));
        snprintf(preload, len, "%s:%s", lib, old);
        set_env("LD_PRELOAD", preload);
        free(preload);
    } else {
        set_env("LD_PRELOAD", lib);
    }

    if (stats != NULL) set_env("HAKMEM_STATS", stats);
    if (check) set_env("HAKMEM_CHECK", "1");
    if (background) set_env("HAKMEM_BACKGROUND", "1");
    if (profile != NULL) {
        /* Relative to where hakmem was run, even if PROGRAM changes directory. */
        char absolute[2 * PATH_MAX], cwd[PATH_MAX];
        if (profile[0] != '/' && getcwd(cwd, sizeof cwd) != NULL) {
            int n = snprintf(absolute, sizeof absolute, "%s/%s", strcmp(cwd, "/") == 0 ? "" : cwd,
                             profile);
            if (n > 0 && (size_t)n < sizeof absolute) profile = absolute;
        }
        set_env("HAKMEM_PROF", "1");
        set_env("HAKMEM_PROF_FILE", profile);
    }

    execvp(argv[i], &argv[i]);
    int err = errno;
    if (err == ENOENT && strchr(argv[i], '/') == NULL) {
        fprintf(stderr, "hakmem: %s: command not found\n", argv[i]);
        return EXIT_NOT_FOUND;
    }
    fprintf(stderr, "hakmem: cannot run %s: %s\n", argv[i], strerror(err));
    return err == ENOENT ? EXIT_NOT_FOUND : EXIT_CANNOT_RUN;
}
