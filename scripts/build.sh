#!/usr/bin/env bash
# Installs what is missing (scripts/setup.sh), then configures and builds Lattice into build/.
# Extra arguments go to CMake, e.g. scripts/build.sh -DLATTICE_SANITIZE="address;undefined".
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${LATTICE_BUILD_DIR:-$root/build}"

bash "$root/scripts/setup.sh"
cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLATTICE_WERROR=ON "$@"
cmake --build "$build_dir" -j "$(nproc)"
