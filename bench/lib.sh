#!/usr/bin/env bash
# Helpers sourced by bench/run.sh and bench/instr.sh.

# Print the path of a shared library: ldconfig's cache first, then the files of
# the Debian package, then the usual multiarch directory.
find_lib() {
    local soname=$1 pkg=$2 p
    p=$(/sbin/ldconfig -p 2>/dev/null | awk -v n="$soname" '$1 == n && /x86-64/ { print $NF; exit }')
    if [ -z "$p" ] && command -v dpkg >/dev/null; then
        p=$(dpkg -L "$pkg" 2>/dev/null | grep -m1 "/$soname\$" || true)
    fi
    [ -z "$p" ] && p=/usr/lib/x86_64-linux-gnu/$soname
    [ -r "$p" ] && echo "$p"
    return 0
}
