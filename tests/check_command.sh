#!/usr/bin/env bash
# The hakmem command (tools/hakmem.c, docs/hakmem.1), used as a user would:
# help, version and bad options; the program's exit status and death by a
# signal passed through (it execs); the program, and what it execs or runs, on
# hakmem with the options' settings; LD_PRELOAD entries kept; an installed copy
# in a moved prefix using its own library; the man page without warnings.
# Prints "FAIL check_command: ..." for each check that fails, and
# "PASS check_command" when none did.
# shellcheck disable=SC2016 # the sh -c scripts in single quotes are expanded by that sh
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
bad() {
  echo "FAIL check_command: $*"
  failures=$((failures + 1))
}
# expect WHAT WANT GOT
expect() {
  [ "$3" = "$2" ] || bad "$1: got '$3', expected '$2'"
}

make -s release >/dev/null || {
  echo "FAIL check_command: make release failed"
  exit 1
}
hakmem=$PWD/out/release/hakmem
lib=$PWD/out/release/libhakmem.so.0
version=$(sed -n 's/^#define HAKMEM_VERSION "\(.*\)"/\1/p' include/hakmem.h)
# The settings the command sets must not come from the caller's environment.
unset LD_PRELOAD HAKMEM_STATS HAKMEM_CHECK HAKMEM_PROF HAKMEM_PROF_FILE HAKMEM_BACKGROUND

# usable: prints malloc_usable_size(malloc(100)): 112 on hakmem (its size
# class), 100 in checked mode (the size asked), 104 on glibc.
cat >"$tmp/usable.c" <<'C'
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
int main(void) {
    char *p = malloc(100);
    printf("%zu\n", malloc_usable_size(p));
    free(p);
    return 0;
}
C
cc "$tmp/usable.c" -o "$tmp/usable"
# hold: exits holding 16 MiB in 1 KiB blocks (what a heap profile shows).
echo '#include <stdlib.h>
int main(void) { for (int i = 0; i < 16384; i++) if (!malloc(1024)) return 1; return 0; }' |
  cc -x c - -o "$tmp/hold"
# Two libraries to preload besides hakmem: they only have to show in the maps.
echo 'int hakmem_test_mark_a;' | cc -shared -fPIC -x c - -o "$tmp/libmark_a.so"
echo 'int hakmem_test_mark_b;' | cc -shared -fPIC -x c - -o "$tmp/libmark_b.so"
out=$("$tmp/usable")
[ "$out" != 112 ] || bad "usable prints 112 without hakmem: the checks below cannot tell"

# ---- --help, --version, bad options ------------------------------------------
rc=0
"$hakmem" --help >"$tmp/out" 2>"$tmp/err" || rc=$?
expect "--help exit status" 0 "$rc"
grep -q '^Usage: hakmem ' "$tmp/out" || bad "--help printed no 'Usage: hakmem' on stdout"
[ ! -s "$tmp/err" ] || bad "--help wrote on stderr: $(head -n 1 "$tmp/err")"
rc=0
out=$("$hakmem" --version 2>"$tmp/err") || rc=$?
expect "--version exit status" 0 "$rc"
expect "--version" "hakmem $version" "$out"
[ ! -s "$tmp/err" ] || bad "--version wrote on stderr: $(head -n 1 "$tmp/err")"

# Each: exit status 2, nothing on stdout, an error and a hint on stderr.
for args in "--bogus true" "--stats=xml true" "--profile" "--profile= true" "-x true" "--" ""; do
  rc=0
  # shellcheck disable=SC2086 # split on purpose
  "$hakmem" $args >"$tmp/out" 2>"$tmp/err" || rc=$?
  expect "hakmem $args: exit status" 2 "$rc"
  [ ! -s "$tmp/out" ] || bad "hakmem $args wrote on stdout"
  expect "hakmem $args: lines on stderr" 2 "$(wc -l <"$tmp/err")"
  grep -q '^hakmem: ' "$tmp/err" || bad "hakmem $args: no 'hakmem: ' error on stderr"
  grep -q -- "--help" "$tmp/err" || bad "hakmem $args: no hint of --help on stderr"
done

# ---- exit status, signals, exec ----------------------------------------------
rc=0
"$hakmem" -- sh -c 'exit 7' || rc=$?
expect "exit status of 'sh -c exit 7'" 7 "$rc"
rc=0
"$hakmem" sh -c 'exit 0' || rc=$?
expect "exit status of 'sh -c exit 0'" 0 "$rc"
# (In braces with stderr closed: bash's "Terminated" notice is not wanted.)
rc=0
{ "$hakmem" -- sh -c 'kill -TERM $$'; } 2>/dev/null || rc=$?
expect "exit status of a program killing itself with SIGTERM" 143 "$rc"
# Killed from outside by the pid the caller knows: the program's own.
rc=0
"$hakmem" -- sleep 60 &
pid=$!
sleep 0.2
kill -TERM "$pid"
{ wait "$pid"; } 2>/dev/null || rc=$?
expect "exit status of a program killed with SIGTERM" 143 "$rc"
# exec, not fork: the program has the pid hakmem was started with.
"$hakmem" -- sh -c 'echo $$' >"$tmp/out" &
pid=$!
wait "$pid" || bad "hakmem -- sh -c 'echo \$\$' failed"
expect "pid of the program" "$pid" "$(cat "$tmp/out")"
# Arguments passed as they are, options after the program its own.
out=$("$hakmem" -- printf '%s|' a 'b c' '' --check) || true
expect "arguments" "a|b c||--check|" "$out"
out=$("$hakmem" sh -c 'echo "${HAKMEM_CHECK-unset} $0"' --check) || true
expect "an option after the program" "unset --check" "$out"
rc=0
"$hakmem" -- --check 2>"$tmp/err" || rc=$?
expect "exit status of '-- --check' (no program --check)" 127 "$rc"

# Not found, not executable, no library: as a shell, and env for its own failure.
rc=0
"$hakmem" hakmem-no-such-program 2>"$tmp/err" || rc=$?
expect "exit status for a program not found" 127 "$rc"
grep -q 'hakmem-no-such-program' "$tmp/err" || bad "not-found message does not name the program"
rc=0
"$hakmem" "$tmp/no-such-file" 2>"$tmp/err" || rc=$?
expect "exit status for a path not found" 127 "$rc"
printf '#!/bin/sh\n' >"$tmp/noexec"
chmod 644 "$tmp/noexec"
rc=0
"$hakmem" "$tmp/noexec" 2>"$tmp/err" || rc=$?
expect "exit status for a program not executable" 126 "$rc"
grep -q "$tmp/noexec" "$tmp/err" || bad "not-executable message does not name the program"
mkdir "$tmp/alone"
cp "$hakmem" "$tmp/alone/"
rc=0
"$tmp/alone/hakmem" true 2>"$tmp/err" || rc=$?
expect "exit status without the library" 125 "$rc"
grep -q 'libhakmem.so.0' "$tmp/err" || bad "no-library message does not name libhakmem.so.0"

# ---- on hakmem, with the settings --------------------------------------------
expect "malloc_usable_size(100) under hakmem" 112 "$("$hakmem" "$tmp/usable")"
expect "malloc_usable_size(100) under hakmem --check" 100 "$("$hakmem" --check -- "$tmp/usable")"
"$hakmem" --stats -- "$tmp/usable" >/dev/null 2>"$tmp/err" || bad "--stats: usable failed"
grep -q '^hakmem: stats' "$tmp/err" || bad "--stats printed no 'hakmem: stats' summary on stderr"
"$hakmem" -- "$tmp/usable" >/dev/null 2>"$tmp/err" || bad "usable failed"
[ ! -s "$tmp/err" ] || bad "without --stats: stderr has $(head -n 1 "$tmp/err")"
# What the program execs or runs is on hakmem too, with the same settings.
expect "an exec'd grandchild" 112 "$("$hakmem" -- sh -c 'exec "$0"' "$tmp/usable")"
expect "a forked grandchild" 112 "$("$hakmem" -- sh -c '"$0"; :' "$tmp/usable")"
expect "an exec'd grandchild with --check" 100 "$("$hakmem" --check -- sh -c 'exec "$0"' "$tmp/usable")"

# The variables of each option (the library prints a warning for a value it
# does not know yet: stderr is not looked at).
vars='echo "${HAKMEM_STATS-unset} ${HAKMEM_CHECK-unset} ${HAKMEM_PROF-unset} ${HAKMEM_PROF_FILE-unset} ${HAKMEM_BACKGROUND-unset}"'
expect "variables without options" "unset unset unset unset unset" \
  "$("$hakmem" -- sh -c "$vars" 2>/dev/null)"
expect "variables of --stats --check" "1 1 unset unset unset" \
  "$("$hakmem" --stats --check -- sh -c "$vars" 2>/dev/null)"
expect "variables of --stats=json --profile F --background" "json unset 1 /tmp/x 1" \
  "$("$hakmem" --stats=json --profile /tmp/x --background -- sh -c "$vars" 2>/dev/null)"
expect "variables of --profile=F" "unset unset 1 /tmp/p.%p unset" \
  "$("$hakmem" --profile=/tmp/p.%p sh -c "$vars" 2>/dev/null)"
# A relative profile file is taken from where hakmem was run.
out=$(cd "$tmp/alone" && "$hakmem" --profile rel.%p -- sh -c 'cd / && echo "$HAKMEM_PROF_FILE"') || true
expect "relative --profile file" "$(cd "$tmp/alone" && pwd -P)/rel.%p" "$out"
# What --profile does in the library: a heap profile at exit, with bytes in
# use (tests/check_prof.sh reads profiles with google-pprof).
"$hakmem" --profile "$tmp/alone/run.%p.heap" -- "$tmp/hold" || bad "--profile: the program failed"
heap=$(find "$tmp/alone" -name 'run.*.heap')
if [ -z "$heap" ] || ! head -1 "$heap" | grep -q '^heap profile: [0-9]*: *[1-9][0-9]* '; then
  bad "--profile: no heap profile with bytes in use written ($heap)"
fi

# ---- LD_PRELOAD --------------------------------------------------------------
out=$(LD_PRELOAD="$tmp/libmark_a.so $tmp/libmark_b.so" "$hakmem" -- sh -c 'echo "$LD_PRELOAD"') || true
expect "LD_PRELOAD" "$lib:$tmp/libmark_a.so $tmp/libmark_b.so" "$out"
for sep in ' ' ':'; do
  maps=$(LD_PRELOAD="$tmp/libmark_a.so$sep$tmp/libmark_b.so" "$hakmem" -- cat /proc/self/maps) ||
    bad "LD_PRELOAD separated by '$sep': failed"
  for l in libhakmem.so libmark_a.so libmark_b.so; do
    grep -q "/$l" <<<"$maps" || bad "LD_PRELOAD separated by '$sep': $l not loaded in the program"
  done
done
expect "LD_PRELOAD empty before" "$lib" "$(LD_PRELOAD='' "$hakmem" -- sh -c 'echo "$LD_PRELOAD"')"

# ---- installed, then moved -----------------------------------------------------
make -s install PREFIX="$tmp/pfx" >/dev/null || {
  echo "FAIL check_command: make install failed"
  exit 1
}
[ -x "$tmp/pfx/bin/hakmem" ] || bad "make install: no bin/hakmem"
cmp -s docs/hakmem.1 "$tmp/pfx/share/man/man1/hakmem.1" || bad "make install: no share/man/man1/hakmem.1"
mv "$tmp/pfx" "$tmp/moved"
mkdir "$tmp/links"
ln -s "$tmp/moved/bin/hakmem" "$tmp/links/hakmem"
# Run by its path, through a symbolic link, and found in PATH.
for how in "$tmp/moved/bin/hakmem" "$tmp/links/hakmem" "PATH"; do
  if [ "$how" = PATH ]; then
    maps=$(PATH="$tmp/moved/bin:$PATH" hakmem -- cat /proc/self/maps) || bad "installed: $how: failed"
  else
    maps=$("$how" -- cat /proc/self/maps) || bad "installed: $how: failed"
  fi
  libs=$(grep libhakmem <<<"$maps" | awk '{print $6}' | sort -u)
  expect "installed, run as $how: libhakmem mapped from" "$tmp/moved/lib/libhakmem.so.$version" "$libs"
done
expect "installed: malloc_usable_size(100)" 112 "$("$tmp/moved/bin/hakmem" "$tmp/usable")"
# ld.so splits LD_PRELOAD at spaces: a prefix whose path has one is refused.
cp -a "$tmp/moved" "$tmp/with space"
rc=0
"$tmp/with space/bin/hakmem" true 2>"$tmp/err" || rc=$?
expect "exit status for a library path with a space" 125 "$rc"

# ---- the man page --------------------------------------------------------------
if command -v groff >/dev/null; then
  warnings=$(groff -man -ww -z docs/hakmem.1 2>&1)
  [ -z "$warnings" ] || bad "docs/hakmem.1: $warnings"
else
  bad "groff not found (Debian package groff-base): the man page is not checked"
fi

[ "$failures" -eq 0 ] || exit 1
echo "PASS check_command"
