#!/bin/bash
# Installs what `make test` needs, only when missing. Idempotent and quick
# when everything is present: one dpkg query, no network.
set -euo pipefail

# clang and its runtimes: the sanitizer builds and libFuzzer (make checked);
# llvm: llvm-symbolizer for their reports; cppcheck (and gcc -fanalyzer):
# tests/check_analyzer.sh; google-perftools (google-pprof) and graphviz (its
# --svg): tests/check_prof.sh reads heap profiles as a user would; groff-base:
# the man page in tests/check_command.sh; dpkg-dev, debhelper and lintian:
# the Debian packages in tests/check_deb.sh.
pkgs=(libcmocka-dev redis-server redis-tools sqlite3 g++ git python3 gawk pkg-config cmake
    clang libclang-rt-14-dev llvm cppcheck google-perftools graphviz groff-base
    dpkg-dev debhelper lintian)

missing=()
for p in "${pkgs[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null) || status=
    [ "$status" = "install ok installed" ] || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "tests/deps.sh: installing ${missing[*]}" >&2
as_root=()
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || {
        echo "tests/deps.sh: need root (or sudo) to install ${missing[*]}" >&2
        exit 1
    }
    as_root=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${as_root[@]}" apt-get update -q
"${as_root[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
