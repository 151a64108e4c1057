#!/usr/bin/env bash
# The Debian packages (debian/, `make deb`): built, lintian without errors
# or warnings, installed with dpkg, used (the hakmem command, a program
# built with pkg-config, one with CMake's find_package), removed, and
# nothing of them left behind (issue 34). Needs root (dpkg -i); leaves a
# machine that has hakmem's packages installed already alone.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
pkgs=(hakmem libhakmem-dev libhakmem0)
cleanup() {
    [ -z "${installed:-}" ] || dpkg --purge "${pkgs[@]}" >/dev/null 2>&1 || true
    rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL check_deb: $*"; exit 1; }

if [ "$(id -u)" -ne 0 ]; then
    echo "SKIP check_deb: needs root (dpkg -i)"
    exit 0
fi
for p in "${pkgs[@]}"; do
    if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
        echo "SKIP check_deb: $p is installed on this machine; not touching it"
        exit 0
    fi
done

make -s deb > "$tmp/build.log" 2>&1 || fail "make deb: $(tail -20 "$tmp/build.log")"
# A symbol added or gone since debian/libhakmem0.symbols was written.
if grep -A20 'dpkg-gensymbols: warning' "$tmp/build.log"; then
    fail "debian/libhakmem0.symbols differs from the library's exports (above)"
fi
debs=()
for p in "${pkgs[@]}"; do
    f=$(ls out/deb/"${p}"_*_amd64.deb 2>/dev/null) || fail "no package $p"
    debs+=("$f")
done
lintian --fail-on error,warning out/deb/hakmem_*.changes > "$tmp/lintian.log" 2>&1 ||
    fail "lintian: $(grep -v 'root privileges' "$tmp/lintian.log")"
if grep -E '^[EW]: ' "$tmp/lintian.log"; then fail "lintian reports the lines above"; fi

installed=1
dpkg -i "${debs[@]}" > "$tmp/install.log" 2>&1 || fail "dpkg -i: $(cat "$tmp/install.log")"
for p in "${pkgs[@]}"; do dpkg -L "$p"; done | sort -u > "$tmp/files"
# Every shipped path (directories Debian's own base packages hold aside).
while read -r f; do [ -d "$f" ] || echo "$f"; done < "$tmp/files" > "$tmp/shipped"
grep -q '/usr/lib/x86_64-linux-gnu/libhakmem.so.0$' "$tmp/shipped" || fail "no libhakmem.so.0 shipped"

# The command preloads the installed library.
hakmem -- ls / > "$tmp/ls.out" || fail "hakmem -- ls failed"
grep -qx usr "$tmp/ls.out" || fail "hakmem -- ls / listed no usr"
hakmem -- cat /proc/self/maps > "$tmp/maps" || fail "hakmem -- cat failed"
grep -q '/x86_64-linux-gnu/libhakmem.so.0.1.0' "$tmp/maps" ||
    fail "hakmem -- cat: the installed library is not loaded"

cp tests/install_app.c "$tmp/app.c"
# shellcheck disable=SC2046 # (pkg-config's words are separate flags)
cc "$tmp/app.c" -o "$tmp/app_pc" $(pkg-config --cflags --libs hakmem) || fail "pkg-config build"
[ "$("$tmp/app_pc")" = "112 1" ] || fail "the pkg-config program does not run on hakmem"
ldd "$tmp/app_pc" > "$tmp/ldd" || fail "ldd failed"
grep -q 'libhakmem.so.0 => .*/x86_64-linux-gnu/libhakmem.so.0' "$tmp/ldd" ||
    fail "not linked to the package's library: $(cat "$tmp/ldd")"

mkdir "$tmp/cm"
cp "$tmp/app.c" "$tmp/cm/app.c"
cat > "$tmp/cm/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.13)
project(app C)
find_package(hakmem REQUIRED)
add_executable(app app.c)
target_link_libraries(app PRIVATE hakmem::hakmem)
add_executable(app_static app.c)
target_link_libraries(app_static PRIVATE hakmem::hakmem_static)
CM
(cd "$tmp/cm" && cmake -S . -B build > "$tmp/cmake.log" 2>&1 && cmake --build build >> "$tmp/cmake.log" 2>&1) ||
    fail "cmake: $(tail -20 "$tmp/cmake.log")"
[ "$("$tmp/cm/build/app")" = "112 1" ] || fail "the CMake program does not run on hakmem"
[ "$("$tmp/cm/build/app_static")" = "112 1" ] || fail "the static CMake program does not run on hakmem"

dpkg -r "${pkgs[@]}" > "$tmp/remove.log" 2>&1 || fail "dpkg -r: $(cat "$tmp/remove.log")"
dpkg --purge "${pkgs[@]}" >> "$tmp/remove.log" 2>&1 || fail "dpkg --purge: $(cat "$tmp/remove.log")"
installed=
for p in "${pkgs[@]}"; do
    ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q installed || fail "$p still installed"
done
left=$(while read -r f; do [ -e "$f" ] || [ -L "$f" ] && echo "$f"; done < "$tmp/shipped" || true)
[ -z "$left" ] || fail "left behind after removal: $left"
ldconfig -p > "$tmp/ldcache"
! grep -q libhakmem "$tmp/ldcache" || fail "libhakmem still in the dynamic linker's cache"
hash -r
! command -v hakmem >/dev/null || fail "the hakmem command is still on PATH"
echo "PASS check_deb ($(wc -l < "$tmp/shipped") files installed and removed)"
