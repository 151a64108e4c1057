#!/bin/bash
# Only core/box/os.c may talk to the kernel's memory-mapping calls: fails,
# naming file and line, if any other .c/.h under core/ calls mmap, munmap,
# madvise, mremap, mprotect, mlock or munlock. Comment-only lines (starting with *, // or /*) are
# ignored.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

[ -d core ] || {
    echo "FAIL check_os_boundary: core/ not found"
    exit 1
}
violations=$(
    find core -type f \( -name '*.c' -o -name '*.h' \) ! -path core/box/os.c -print0 |
        sort -z |
        xargs -0 -r grep -nHE '\b(mmap|munmap|madvise|mremap|mprotect|mlock|munlock)[[:space:]]*\(' |
        grep -vE '^[^:]+:[0-9]+:[[:space:]]*(\*|//|/\*)' || true
)
if [ -n "$violations" ]; then
    while IFS= read -r v; do
        file=${v%%:*}
        rest=${v#*:}
        line=${rest%%:*}
        text=${rest#*:}
        echo "FAIL check_os_boundary: $file:$line: ${text#"${text%%[![:space:]]*}"}"
    done <<<"$violations"
    exit 1
fi
echo "PASS check_os_boundary"
