#!/usr/bin/env bash
# `make install` into a temporary prefix, then build a program against it with
# pkg-config and with CMake (find_package; shared and static each) and check
# hakmem is the allocator it runs on.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL check_install: $*"; exit 1; }

make -s install PREFIX="$tmp/pfx" >/dev/null || fail "make install failed"
for f in lib/libhakmem.so.0 lib/libhakmem.so lib/libhakmem.a include/hakmem.h lib/pkgconfig/hakmem.pc \
  lib/cmake/hakmem/hakmem-config.cmake lib/cmake/hakmem/hakmem-config-version.cmake; do
  [ -e "$tmp/pfx/$f" ] || fail "missing $f"
done
cp tests/install_app.c "$tmp/app.c"
export PKG_CONFIG_PATH="$tmp/pfx/lib/pkgconfig"
# shellcheck disable=SC2046
cc "$tmp/app.c" $(pkg-config --cflags --libs hakmem) -Wl,-rpath,"$tmp/pfx/lib" -o "$tmp/app_shared" \
  || fail "shared link failed"
# shellcheck disable=SC2046
cc "$tmp/app.c" $(pkg-config --cflags hakmem) "$tmp/pfx/lib/libhakmem.a" -pthread -o "$tmp/app_static" \
  || fail "static link failed"
# Not `ldd | grep -q`: under pipefail, grep -q's early exit can kill ldd with
# SIGPIPE and fail the pipeline although the line was there.
libs=$(ldd "$tmp/app_shared") || fail "ldd failed"
grep -q 'libhakmem.so.0' <<<"$libs" || fail "app not linked to libhakmem.so.0"
# A CMake consumer, as a project would use it: find_package with a version,
# the imported targets, nothing else. The prefix is moved first: the package
# finds its files relative to itself.
cp -a "$tmp/pfx" "$tmp/moved"
mkdir -p "$tmp/cmk"
cp "$tmp/app.c" "$tmp/cmk/"
cat > "$tmp/cmk/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.16)
project(app C)
find_package(hakmem 0.1 REQUIRED)
add_executable(app_cmake app.c)
target_link_libraries(app_cmake PRIVATE hakmem::hakmem)
add_executable(app_cmake_static app.c)
target_link_libraries(app_cmake_static PRIVATE hakmem::hakmem_static)
CMAKE
cmake -S "$tmp/cmk" -B "$tmp/cmk/build" -DCMAKE_PREFIX_PATH="$tmp/moved" >"$tmp/cmake.log" 2>&1 || {
  cat "$tmp/cmake.log"
  fail "cmake configure failed"
}
cmake --build "$tmp/cmk/build" >>"$tmp/cmake.log" 2>&1 || {
  cat "$tmp/cmake.log"
  fail "cmake build failed"
}
cp "$tmp/cmk/build/app_cmake" "$tmp/cmk/build/app_cmake_static" "$tmp/"
libs=$(ldd "$tmp/app_cmake") || fail "ldd failed"
grep -q "$tmp/moved/lib/libhakmem.so.0" <<<"$libs" || fail "app_cmake not linked to the moved libhakmem.so.0"
# A major version the package is not must not be found.
sed -i 's/find_package(hakmem 0.1 REQUIRED)/find_package(hakmem 1 REQUIRED)/' "$tmp/cmk/CMakeLists.txt"
if cmake -S "$tmp/cmk" -B "$tmp/cmk/build1" -DCMAKE_PREFIX_PATH="$tmp/moved" >/dev/null 2>&1; then
  fail "find_package(hakmem 1) accepted version $(sed -n 's/^#define HAKMEM_VERSION "\(.*\)"/\1/p' include/hakmem.h)"
fi

for app in app_shared app_static app_cmake app_cmake_static; do
  out=$("$tmp/$app") || fail "$app exited non-zero"
  [ "$out" = "112 1" ] || fail "$app printed '$out', expected '112 1'"
done
echo "PASS check_install"
