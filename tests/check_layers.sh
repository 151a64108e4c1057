#!/bin/bash
# Boxes never call up: a file under core/box/ includes only other boxes'
# headers, sizes.h and the public hakmem.h, never a tier's (tiny.h, pool.h,
# l25.h, large.h, check.h, tcache.h, superslab/) or the front's. Fails,
# naming file and line, otherwise. (The stats box once gathered the tiers'
# counters itself; the front's collector, core/front/report.c, does now.)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

[ -d core/box ] || {
    echo "FAIL check_layers: core/box/ not found"
    exit 1
}
violations=$(
    grep -nHE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' core/box/*.c core/box/*.h |
        grep -vE '#[[:space:]]*include[[:space:]]*"(box/[a-z_]+\.h|sizes\.h|hakmem\.h)"' || true
)
if [ -n "$violations" ]; then
    while IFS= read -r v; do
        echo "FAIL check_layers: $v"
    done <<<"$violations"
    exit 1
fi
echo "PASS check_layers"
