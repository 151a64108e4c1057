#!/bin/bash
# sqlite3 CLI: 100k inserts in one transaction, then aggregate, sort and
# index queries; the output must match with and without hakmem preloaded.
set -euo pipefail
NAME=sqlite
# shellcheck source=tests/real/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

command -v sqlite3 >/dev/null || fail "sqlite3 not installed"
require_lib

# Deterministic data: integer arithmetic only, so any awk gives the same SQL.
awk 'BEGIN {
    print "CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT, grp INTEGER, val REAL, payload TEXT);"
    print "BEGIN;"
    for (i = 1; i <= 100000; i++) {
        h = (i * 2654435761) % 4294967296
        pad = substr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", 1, 10 + h % 50)
        printf "INSERT INTO t VALUES(%d,%cname%06d%c,%d,%d.%02d,%c%s%c);\n", \
            i, 39, h % 1000003, 39, h % 97, h % 10007, i % 100, 39, pad, 39
    }
    print "COMMIT;"
}' >"$TMP/data.sql"

cat >"$TMP/queries.sql" <<'SQL'
.headers on
.mode list
SELECT count(*), sum(grp), printf('%.2f', sum(val)), sum(length(payload)) FROM t;
SELECT grp, count(*), printf('%.2f', avg(val)), max(name) FROM t GROUP BY grp ORDER BY grp;
SELECT id, name, val FROM t ORDER BY val DESC, id LIMIT 25;
SELECT id, name FROM t ORDER BY name, id LIMIT 10 OFFSET 5000;
CREATE INDEX t_name ON t(name);
CREATE INDEX t_grp_val ON t(grp, val);
SELECT id, grp, val FROM t WHERE name = (SELECT name FROM t WHERE id = 4242);
SELECT count(*), printf('%.2f', sum(val)) FROM t WHERE grp = 13 AND val BETWEEN 100 AND 5000;
SELECT group_concat(id, ',') FROM (SELECT id FROM t WHERE grp = 42 ORDER BY val LIMIT 40);
UPDATE t SET payload = payload || payload WHERE id % 7 = 0;
DELETE FROM t WHERE id % 11 = 0;
SELECT count(*), sum(length(payload)) FROM t;
PRAGMA integrity_check;
SQL

for mode in plain hakmem; do
    rc=0
    run_case "$mode" "$TMP/$mode.out" "$TMP/$mode.err" 120 \
        sqlite3 -bail -init /dev/null "$TMP/$mode.db" ".read $TMP/data.sql" ".read $TMP/queries.sql" ||
        rc=$?
    [ "$rc" -eq 0 ] || fail "$mode run: $(describe_rc "$rc"): $(last_err "$TMP/$mode.err")"
done
check_no_diag "$TMP/hakmem.err"
grep -q '^100000|' "$TMP/plain.out" || fail "plain run: unexpected row count"
grep -qx 'ok' "$TMP/plain.out" || fail "plain run: integrity check did not print ok"
cmp -s "$TMP/plain.out" "$TMP/hakmem.out" ||
    fail "output differs: $(diff_head "$TMP/plain.out" "$TMP/hakmem.out")"
pass
