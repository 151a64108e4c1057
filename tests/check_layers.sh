#!/bin/bash
# Calls go one way: every #include "..." under core/ points to its own
# module or to a lower layer, never up, never sideways to another tier.
#
#   0  boxes       core/box/, core/prof/ (the heap profiler), core/sizes.h,
#                  core/sizeclass.h, include/hakmem.h
#   1  superslab   core/superslab/
#   2  tcache      core/tcache.h, core/tcache.c, core/tc_counts.h
#   3  tiers       core/tiny.*, core/pool.*, core/l25/, core/large/,
#                  core/check/ (each a module of its own)
#   4  front       core/front/
#
# A box may include any other box (they form one layer); a tier only its
# own files and the layers below. Fails naming file, line and the two
# layers; then, as `--self-test` alone does, checks that the check fails on
# each kind of violation added on purpose to a copy of core/ (an upward
# include, quoted, in angle brackets or through '..'; a tier including
# another; a box including the superslab; the profiler including the
# thread cache).
set -euo pipefail
self=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
cd "$(dirname "$self")/.."

if [ "${1:-}" = "--self-test" ]; then
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/hakmem-layers.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    mkdir -p "$tmp/tests"
    cp -r core include "$tmp/"
    cp tests/check_layers.sh "$tmp/tests/"
    [ -f "$tmp/core/tcache.c" ] || {
        echo "FAIL check_layers --self-test: core/tcache.c not found"
        exit 1
    }
    # Each of these, added alone, must fail the check and be named.
    cases=('core/tcache.c|#include "front/front.h"'
        'core/tcache.c|#include <front/front.h>'
        'core/tcache.c|#include "box/../front/front.h"'
        'core/pool.c|#include "tiny.h"'
        'core/box/os.c|#  include   "superslab/ss.h" // a comment'
        'core/prof/prof.c|#include "tcache.h"')
    for c in "${cases[@]}"; do
        file=${c%%|*} line=${c#*|}
        cp "core/${file#core/}" "$tmp/$file"
        printf '%s\n' "$line" >>"$tmp/$file"
        if out=$(LAYERS_INNER=1 bash "$tmp/tests/check_layers.sh" 2>&1); then
            echo "FAIL check_layers --self-test: passed with '$line' in $file"
            exit 1
        fi
        grep -q "$file:" <<<"$out" || {
            echo "FAIL check_layers --self-test: '$line' in $file not named: $out"
            exit 1
        }
        cp "core/${file#core/}" "$tmp/$file"
    done
    echo "PASS check_layers --self-test"
    exit 0
fi

[ -d core/box ] || {
    echo "FAIL check_layers: core/box/ not found"
    exit 1
}

# layer_of PATH (relative to core/, or hakmem.h) -> "layer module"
layer_of() {
    case "$1" in
    hakmem.h | sizes.h | sizeclass.h | sizeclass.c | box/* | prof/*) echo "0 box" ;;
    superslab/*) echo "1 superslab" ;;
    tcache.h | tcache.c | tc_counts.h) echo "2 tcache" ;;
    tiny.[ch]) echo "3 tiny" ;;
    pool.[ch]) echo "3 pool" ;;
    l25/*) echo "3 l25" ;;
    large/*) echo "3 large" ;;
    check/*) echo "3 check" ;;
    front/*) echo "4 front" ;;
    *) echo "? ?" ;;
    esac
}
names=(box superslab tcache tier front)

fails=0
while IFS= read -r file; do
    rel=${file#core/}
    read -r fl fm <<<"$(layer_of "$rel")"
    if [ "$fl" = "?" ]; then
        echo "FAIL check_layers: $file is in no layer (add it to tests/check_layers.sh)"
        fails=$((fails + 1))
        continue
    fi
    while IFS=: read -r line inc; do
        quoted=false
        grep -qE '^[[:space:]]*#[[:space:]]*include(_next)?[[:space:]]*"' <<<"$inc" && quoted=true
        inc=$(sed -E 's/^[[:space:]]*#[[:space:]]*include(_next)?[[:space:]]*["<]([^">]+)[">].*/\2/' <<<"$inc")
        # A system header (<stdio.h>) is no layer's; one of core/ or
        # include/ under angle brackets is found by -Icore just the same.
        if ! $quoted && [ ! -e "core/$inc" ] && [ ! -e "include/$inc" ]; then continue; fi
        read -r il im <<<"$(layer_of "$inc")"
        if [[ "$inc" == *..* ]]; then
            echo "FAIL check_layers: $file:$line includes \"$inc\": a path with .. hides its layer"
            fails=$((fails + 1))
        elif [ "$il" = "?" ]; then
            echo "FAIL check_layers: $file:$line includes \"$inc\", in no layer"
            fails=$((fails + 1))
        elif [ "$il" -gt "$fl" ]; then
            echo "FAIL check_layers: $file:$line (${names[$fl]}) includes \"$inc\" (${names[$il]}): a call up"
            fails=$((fails + 1))
        elif [ "$il" -eq 3 ] && [ "$fl" -eq 3 ] && [ "$im" != "$fm" ]; then
            echo "FAIL check_layers: $file:$line (tier $fm) includes \"$inc\" (tier $im): tiers do not call each other"
            fails=$((fails + 1))
        fi
    done < <(grep -nE '^[[:space:]]*#[[:space:]]*include(_next)?[[:space:]]*["<]' "$file" || true)
done < <(find core -type f \( -name '*.c' -o -name '*.h' \) | sort)

if [ "$fails" -ne 0 ]; then
    exit 1
fi
echo "PASS check_layers"
# And the check itself is shown to catch a call up (not from the self-test's
# own run).
[ -n "${LAYERS_INNER:-}" ] || exec bash "$self" --self-test
