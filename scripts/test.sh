#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite (the second command of README.md).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${LATTICE_BUILD_DIR:-$root/build}"

bash "$root/scripts/build.sh" -DLATTICE_BUILD_TESTS=ON -DLATTICE_BUILD_BENCH=ON "$@"
cd "$build_dir"
ctest --output-on-failure -j "$(nproc)" --timeout 300
