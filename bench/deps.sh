#!/usr/bin/env bash
# Install the allocators that bench/run.sh compares hakmem against (Debian's
# mimalloc and jemalloc), valgrind for bench/instr.sh, strace for
# bench/syscalls.sh, and the programs bench/real.sh runs. Idempotent: does nothing when they are installed, and runs
# `apt-get update` at most once, only when something must be installed.
set -euo pipefail

pkgs=(libmimalloc2.0 libjemalloc2 valgrind strace time git gcc python3)

missing=()
for p in "${pkgs[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null) || status=
    [ "$status" = "install ok installed" ] || missing+=("$p")
done
[ "${#missing[@]}" -eq 0 ] && exit 0

echo "bench/deps.sh: installing ${missing[*]}" >&2
sudo=()
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        sudo=(sudo)
    else
        echo "bench/deps.sh: not root and no sudo; install ${missing[*]} by hand" >&2
        exit 1
    fi
fi
export DEBIAN_FRONTEND=noninteractive
# Try without refreshing the package lists first; update only if that fails.
if ! "${sudo[@]}" apt-get install -y --no-install-recommends "${missing[@]}"; then
    "${sudo[@]}" apt-get update
    "${sudo[@]}" apt-get install -y --no-install-recommends "${missing[@]}"
fi
