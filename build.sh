#!/usr/bin/env bash
# Thin wrapper: ./build.sh [make target...]   (default: release)
set -euo pipefail
cd "$(dirname "$0")"
exec make -j"$(nproc)" "${@:-release}"
