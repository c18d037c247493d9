#!/usr/bin/env bash
# Sets up, builds and runs the demo (the first command of README.md): prepares the Shakespeare
# corpus as byte tokens, trains the shakespeare-char model across 2 in-process data-parallel
# ranks (global batch 12 = 6 per rank; docs/data-parallel.md), prints progress, the validation
# loss, the wall time and sampled text.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${LATTICE_BUILD_DIR:-$root/build}"
corpus="${LATTICE_CORPUS:-$root/../shared/data/tinyshakespeare.txt}"

bash "$root/scripts/build.sh" -DLATTICE_BUILD_TESTS=OFF -DLATTICE_BUILD_BENCH=OFF
cd "$root"
"$build_dir/lattice" data prepare --input "$corpus" --out runs/data/shakespeare-char
# Two ranks need two cores (ranks x threads never exceed the cores); one core trains alone.
dp=$(( $(nproc) >= 2 ? 2 : 1 ))
# A quick calibration of this machine (well under a second), so that the run records the
# planner's forecast of its memory and step time for the report to set beside the measured.
"$build_dir/lattice" bench calibrate --quick --max-ranks 2 --out runs/cpu-profile-quick.json > /dev/null
"$build_dir/lattice" train configs/shakespeare-char.toml --dp "$dp" --metrics runs/shakespeare-char/metrics.jsonl --plan runs/cpu-profile-quick.json "$@"
echo "every rank's metrics of every step are in runs/shakespeare-char/metrics; one page of charts:"
echo "  $build_dir/lattice report runs/shakespeare-char    # writes runs/shakespeare-char/report.html"
