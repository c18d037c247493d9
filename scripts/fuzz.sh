#!/usr/bin/env bash
# Fuzzes the readers of hostile files (tests/fuzz/): each libFuzzer target runs for SECONDS
# (default 60) under ASan + UBSan with leak detection, a per-input timeout (a hang) and a memory
# limit, starting from its seed corpus tests/fuzz/corpus/<target>/.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]      e.g. scripts/fuzz.sh 600, scripts/fuzz.sh 30 manifest
#
# Installs clang if missing (scripts/setup.sh), builds build-fuzz/ (LATTICE_FUZZ_BUILD_DIR), and
# writes per target under runs/fuzz/<target>/ (LATTICE_FUZZ_OUT): log.txt, corpus/ (what the
# fuzzer added; the repository's seeds stay as they are) and findings/ (each input that
# crashed, hung, leaked or ran out of memory). Prints each target's duration and executions and
# exits 1 when any target found something: keep the input in tests/fuzz/regressions/<target>/
# (the replay test, ctest -R Fuzz, runs it from then on) and fix the reader.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
seconds="${1:-60}"
shift || true
targets=("$@")
if ((${#targets[@]} == 0)); then
  targets=(toml_config safetensors manifest token_file cluster_profile model_file)
fi
build_dir="${LATTICE_FUZZ_BUILD_DIR:-$root/build-fuzz}"
out="${LATTICE_FUZZ_OUT:-$root/runs/fuzz}"
timeout_s="${LATTICE_FUZZ_TIMEOUT_S:-10}"  # one input running longer is a hang
rss_mb="${LATTICE_FUZZ_RSS_MB:-2048}"
# The readers that open files get each input as a file in a scratch directory under TMPDIR:
# memory-backed /dev/shm makes that 20x faster than a disk-backed /tmp.
scratch_root="${LATTICE_FUZZ_TMPDIR:-$([[ -w /dev/shm ]] && echo /dev/shm || echo "${TMPDIR:-/tmp}")}"

if [[ "${LATTICE_FUZZ_SKIP_BUILD:-0}" != 1 ]]; then  # 1: run what build-fuzz/ already holds
  bash "$root/scripts/setup.sh" clang libclang-rt-dev
  CC=clang CXX=clang++ cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DLATTICE_BUILD_FUZZ=ON -DLATTICE_BUILD_TESTS=OFF -DLATTICE_BUILD_BENCH=OFF -DLATTICE_WERROR=ON
  cmake --build "$build_dir" -j "$(nproc)" --target "${targets[@]/%/_fuzz}"
fi

export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:symbolize=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
summary=()
failed=0
for t in "${targets[@]}"; do
  dir="$out/$t"
  mkdir -p "$dir/corpus" "$dir/findings"
  echo "fuzz: $t for ${seconds}s (log: $dir/log.txt)"
  start=$(date +%s)
  touch "$dir/.started"
  scratch="$(mktemp -d "$scratch_root/lattice-fuzz-$t.XXXXXX")"
  set +e
  TMPDIR="$scratch" "$build_dir/tests/fuzz/${t}_fuzz" -max_total_time="$seconds" -timeout="$timeout_s" \
    -rss_limit_mb="$rss_mb" -detect_leaks=1 -print_final_stats=1 \
    -artifact_prefix="$dir/findings/" "$dir/corpus" "$root/tests/fuzz/corpus/$t" \
    >"$dir/log.txt" 2>&1
  rc=$?
  set -e
  rm -rf "$scratch"
  elapsed=$(($(date +%s) - start))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/log.txt" | tail -1)
  found=$(find "$dir/findings" -type f -newer "$dir/.started" | wc -l)
  if ((rc != 0 || found > 0)); then
    failed=1
    verdict="FOUND (exit $rc): $(grep -m1 -E 'ERROR: (libFuzzer|AddressSanitizer|LeakSanitizer)|runtime error|terminate called' "$dir/log.txt" || true)"
    verdict+=" -> $(ls -t "$dir/findings" | head -1)"
  else
    verdict="no crash, hang or leak"
  fi
  summary+=("$(printf '%-16s %5ss %12s execs  %s' "$t" "$elapsed" "${execs:-?}" "$verdict")")
done

echo "fuzz: per target, ${seconds}s each (-timeout=${timeout_s} -rss_limit_mb=${rss_mb}, ASan+UBSan, leaks on)"
printf '  %s\n' "${summary[@]}"
exit "$failed"
