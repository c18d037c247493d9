#!/usr/bin/env bash
# Installs what Lattice needs from Debian packages, skipping what is already there.
# Idempotent: a second run installs nothing and takes a second. Extra arguments are more
# packages a script needs (scripts/fuzz.sh: clang and its libFuzzer runtime).
set -euo pipefail

packages=(
  cmake g++ ninja-build clang-format
  libdnnl-dev                      # matmul (fp32, bf16 on AMX / AVX512-BF16)
  libopenmpi-dev openmpi-bin       # the mpi transport
  libgloo-dev                      # the gloo transport (elastic runs under lattice launch)
  libhiredis-dev libssl-dev        # its store across machines, the job secret's HMAC
  redis-tools                      # redis-server, the store agent 0 serves (launch --nnodes)
  libhwloc-dev                     # cores and NUMA nodes (lattice doctor)
  ethtool                          # NIC pause-frame counters (lattice doctor network)
  libjs-chart.js                   # the charts lattice report inlines
  chromium                         # renders the report in its tests (headless)
  nlohmann-json3-dev               # manifests, safetensors headers, metrics
  libtomlplusplus-dev              # configs
  libcli11-dev                     # the command line
  libfmt-dev libspdlog-dev         # formatting and logging
  libgtest-dev libgmock-dev        # tests
  libbenchmark-dev                 # benchmarks
  "$@"
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi

# Intel oneMKL from PyPI (the vendor's own wheels; Debian's intel-mkl is 2020, before AMX):
# a second GEMM library that lattice::matmul can run (train.gemm_library = "mkl") and that the
# benchmarks time beside oneDNN. Unpacked into .deps/ of this checkout (git ignores it); the
# wheels are only downloaded, never installed into a Python. Without network it is skipped and
# Lattice builds with oneDNN alone.
mkl_version=2026.2.1
mkl_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.deps/mkl-$mkl_version"
if [[ -f "$mkl_dir/include/mkl.h" && -f "$mkl_dir/lib/libmkl_core.so.3" ]]; then
  echo "setup: oneMKL $mkl_version present"
else
  if ! python3 -m pip --version >/dev/null 2>&1; then
    SUDO=""
    if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-pip
  fi
  wheels="$(mktemp -d)"
  if python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 \
      -d "$wheels" "mkl==$mkl_version" "mkl-include==$mkl_version"; then
    rm -rf "$mkl_dir" && mkdir -p "$mkl_dir"
    for wheel in "$wheels"/*.whl; do python3 -m zipfile -e "$wheel" "$wheels/unpacked"; done
    cp -r "$wheels"/unpacked/*.data/data/include "$mkl_dir"/
    mkdir -p "$mkl_dir/lib"
    # The LP64 interface, the GNU OpenMP threading layer, the core and the per-CPU kernels the
    # core loads at run time; not ScaLAPACK, BLACS, TBB or Intel's OpenMP.
    for lib in intel_lp64 gnu_thread core def mc3 avx2 avx512 avx10; do
      cp "$wheels"/unpacked/*.data/data/lib/libmkl_$lib.so.* "$mkl_dir/lib/"
    done
    echo "setup: oneMKL $mkl_version unpacked into $mkl_dir"
  else
    echo "setup: could not download oneMKL $mkl_version from PyPI; building with oneDNN alone"
  fi
  rm -rf "$wheels"
fi
