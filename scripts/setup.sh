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
