#!/usr/bin/env bash
# Builds the test suites with threads in them under ThreadSanitizer and/or AddressSanitizer +
# UndefinedBehaviorSanitizer, each in a build directory of its own, and runs them. Any sanitizer
# report fails the test it comes from, and any failed test fails the script (exit 1).
#
#   scripts/sanitize.sh [thread|address|all] [ctest arguments...]
#
#   scripts/sanitize.sh thread                   # build-tsan: LATTICE_SANITIZE=thread
#   scripts/sanitize.sh address                  # build-asan: LATTICE_SANITIZE="address;undefined"
#   scripts/sanitize.sh all                      # both, one after the other (the default)
#   scripts/sanitize.sh thread -R TensorParallel # extra arguments go to every ctest call
#
# The suites are the layers whose tests run ranks as threads or processes: comm, parallel,
# data_parallel, ckpt, train, elastic, data (the ctest labels of their suites; cli is left out,
# see below). Third-party reports are suppressed by tests/sanitizers/{tsan,lsan}.supp, which CMake
# gives every test (cmake/LatticeLayer.cmake); leak checking stays on for Lattice's own code.
#
# Environment: LATTICE_SANITIZE_JOBS (parallel builds and tests, default: the number of cores),
# LATTICE_MARCH (target ISA, default native; x86-64-v3 builds for AVX2 without AVX-512),
# LATTICE_BUILD_ROOT (where build-tsan/ and build-asan/ go, default: the repository root),
# LATTICE_SANITIZE_COMPILE_ONLY="TARGET..." (configure and compile only these CMake targets, e.g.
# "src/all" for every library and the lattice executable, and run nothing; .ci/run's check that
# the configuration compiles).
# A build from scratch takes 15-25 minutes on 2 shared cores; later runs rebuild what changed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mode="${1:-all}"
[[ $# -gt 0 ]] && shift
ctest_args=("$@")
jobs="${LATTICE_SANITIZE_JOBS:-$(nproc)}"
build_root="${LATTICE_BUILD_ROOT:-$root}"
read -r -a compile_only <<<"${LATTICE_SANITIZE_COMPILE_ONLY:-}"
march="${LATTICE_MARCH:-native}"
suffix=""
[[ "$march" != native ]] && suffix="-$march"  # its own build directories, e.g. build-tsan-x86-64-v3

# The ctest labels run. `cli` (tests/cli) is not among them: it runs the `lattice` executable as
# separate processes, whose threaded code the in-process suites above already cover, and would
# add the executable and minutes of multi-process launches under the sanitizer to every run.
suites=(comm parallel data_parallel ckpt train elastic data)

case "$mode" in
  thread | address | all) ;;
  *)
    echo "scripts/sanitize.sh: unknown mode '$mode'; use thread, address or all" >&2
    exit 2
    ;;
esac

# Every report is fatal at once, with a recognisable exit code:
# - TSan: halt_on_error stops at the first race (exit 66);
# - ASan: errors always abort (exit 1); a leak makes the process exit 23 (detect_leaks on);
# - UBSan: the build has -fno-sanitize-recover=undefined, halt_on_error covers the rest.
# The suppression files are appended to these by CTest (string_append).
export TSAN_OPTIONS="halt_on_error=1 exitcode=66 second_deadlock_stack=1 history_size=7 ${TSAN_OPTIONS:-}"
export ASAN_OPTIONS="detect_leaks=1 halt_on_error=1 ${ASAN_OPTIONS:-}"
export LSAN_OPTIONS="exitcode=23 print_suppressions=0 ${LSAN_OPTIONS:-}"
export UBSAN_OPTIONS="halt_on_error=1 print_stacktrace=1 ${UBSAN_OPTIONS:-}"

# run_sanitizer KIND BUILD_DIR SANITIZERS: configures, builds the suites, runs each label.
run_sanitizer() {
  local kind="$1" build_dir="$2" sanitizers="$3"
  echo "== $kind: configuring $build_dir (LATTICE_SANITIZE=\"$sanitizers\")"
  cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DLATTICE_WERROR=ON -DLATTICE_BUILD_TESTS=ON -DLATTICE_BUILD_BENCH=OFF \
    -DLATTICE_SANITIZE="$sanitizers" -DLATTICE_MARCH="$march" >/dev/null
  if [[ ${#compile_only[@]} -gt 0 ]]; then
    echo "== $kind: compiling ${compile_only[*]} only (LATTICE_SANITIZE_COMPILE_ONLY)"
    cmake --build "$build_dir" -j "$jobs" --target "${compile_only[@]}"
    summary+=("$kind: ${compile_only[*]} compiled for -march=$march (no tests run)")
    return
  fi
  local targets=()
  for suite in "${suites[@]}"; do targets+=("${suite}_tests"); done
  # The mpirun tests of comm and parallel (labels comm;mpi and parallel;mpi).
  targets+=(comm_mpi_tests parallel_mpi_tests)
  echo "== $kind: building ${targets[*]}"
  cmake --build "$build_dir" -j "$jobs" --target "${targets[@]}"

  # A label with no test is an error, unless the caller narrowed the run (-R ...).
  local no_tests=(--no-tests=error)
  [[ ${#ctest_args[@]} -gt 0 ]] && no_tests=()
  local suite start seconds
  for suite in "${suites[@]}"; do
    echo "== $kind: ctest -L ^$suite\$"
    start=$(date +%s)
    # -LE cli: tests/cli carries the label elastic too (its launch tests).
    if (cd "$build_dir" && ctest -L "^$suite\$" -LE '^cli$' -j "$jobs" --timeout 900 \
      --output-on-failure "${no_tests[@]}" "${ctest_args[@]}"); then
      summary+=("$kind $suite: passed in $(($(date +%s) - start)) s")
    else
      seconds=$(($(date +%s) - start))
      summary+=("$kind $suite: FAILED in $seconds s (reports above; ctest log in $build_dir/Testing/Temporary/LastTest.log)")
      failed=1
    fi
  done
}

summary=()
failed=0
if [[ "$mode" == thread || "$mode" == all ]]; then
  run_sanitizer thread "$build_root/build-tsan$suffix" "thread"
fi
if [[ "$mode" == address || "$mode" == all ]]; then
  run_sanitizer address "$build_root/build-asan$suffix" "address;undefined"
fi

echo "== summary"
printf '%s\n' "${summary[@]}"
exit "$failed"
