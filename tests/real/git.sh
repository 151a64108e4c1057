#!/bin/bash
# git on a generated repository (hundreds of files, 3 commits) with fixed
# identities and dates: hashes, log --stat and diff --stat must match with
# and without hakmem preloaded.
set -euo pipefail
NAME=git
# shellcheck source=tests/real/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

command -v git >/dev/null || fail "git not installed"
require_lib

# Runs in a subshell inside $1 (a fresh directory); prints what is compared.
scenario() {
    set -euo pipefail
    cd "$1"
    export HOME=$1/home GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null
    export GIT_AUTHOR_NAME='Hak Tester' GIT_AUTHOR_EMAIL='author@example.com'
    export GIT_COMMITTER_NAME='Hak Committer' GIT_COMMITTER_EMAIL='committer@example.com'
    export GIT_PAGER=cat PAGER=cat LC_ALL=C TZ=UTC
    mkdir -p home repo
    cd repo
    git init -q -b main .
    # commit 1: 300 files in 10 directories
    awk 'BEGIN {
        for (f = 0; f < 300; f++) {
            path = sprintf("dir%02d/file%03d.txt", f % 10, f)
            system("mkdir -p " sprintf("dir%02d", f % 10))
            for (l = 0; l < 20 + f % 40; l++)
                printf "line %d of file %d: %d\n", l, f, (f * 131 + l * 17) % 1009 > path
            close(path)
        }
    }'
    git add -A
    GIT_AUTHOR_DATE='2021-03-04T05:06:07+00:00' GIT_COMMITTER_DATE='2021-03-04T05:06:07+00:00' \
        git commit -q -m 'initial import'
    # commit 2: edit 100 files, add 50, delete 20
    awk 'BEGIN {
        for (f = 0; f < 100; f++) {
            path = sprintf("dir%02d/file%03d.txt", f % 10, f * 3)
            printf "appended in commit two %d\n", f >> path
            close(path)
        }
        system("mkdir -p extra")
        for (f = 0; f < 50; f++) {
            path = sprintf("extra/new%02d.txt", f)
            for (l = 0; l < f + 5; l++) printf "new %d %d\n", f, l > path
            close(path)
        }
    }'
    for f in $(seq 1 20); do git rm -q "dir$(printf %02d $((f % 10)))/file$(printf %03d $((f * 13 % 300))).txt" 2>/dev/null || true; done
    git add -A
    GIT_AUTHOR_DATE='2021-03-05T05:06:07+00:00' GIT_COMMITTER_DATE='2021-03-05T06:00:00+00:00' \
        git commit -q -m 'second: edits, additions, deletions'
    # commit 3: rewrite a directory and rename files
    git mv -k extra renamed
    for f in dir03/*.txt; do sed -i 's/line/LINE/' "$f"; done
    git add -A
    GIT_AUTHOR_DATE='2021-03-06T05:06:07+00:00' GIT_COMMITTER_DATE='2021-03-06T07:00:00+00:00' \
        git commit -q -m 'third: rename and rewrite'
    echo "== rev-parse"
    git rev-parse HEAD HEAD~1 HEAD~2 'HEAD^{tree}'
    echo "== log --stat"
    git log --stat
    echo "== diff --stat"
    git diff --stat HEAD~2 HEAD
    echo "== diff -M --stat"
    git diff -M --stat HEAD~1 HEAD
    echo "== repack + fsck"
    git repack -a -d -q
    git fsck --strict --no-progress 2>&1
    git count-objects -v | grep -E '^(count|in-pack|packs):'
}

for mode in plain hakmem; do
    mkdir -p "$TMP/$mode"
    rc=0
    run_case "$mode" "$TMP/$mode.out" "$TMP/$mode.err" 120 \
        bash -c "$(declare -f scenario); scenario $TMP/$mode" || rc=$?
    [ "$rc" -eq 0 ] || fail "$mode run: $(describe_rc "$rc"): $(last_err "$TMP/$mode.err")"
done
check_no_diag "$TMP/hakmem.err"
n=$(grep -c '^commit ' "$TMP/plain.out") || true
[ "$n" -eq 3 ] || fail "plain run: expected 3 commits in log, got $n"
cmp -s "$TMP/plain.out" "$TMP/hakmem.out" ||
    fail "output differs: $(diff_head "$TMP/plain.out" "$TMP/hakmem.out")"
pass
