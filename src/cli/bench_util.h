// Small pieces every `lattice bench` subcommand prints or computes the same way.
#pragma once

#include <cstddef>
#include <string>

#include "core/dtype.h"
#include "core/statistics.h"

namespace lattice::cli {

// "0.52 (1 min) 0.61 (5 min) on 2 cores" from /proc/loadavg, or "unknown": benchmarks print it at
// start and end, so a reader can tell a quiet run from a contended one.
std::string load_average();
// "fp32" or "bf16" (ValueError naming the choices otherwise).
DType parse_precision(const std::string& name);
// The best of 5 single-thread memcpy calls of `bytes` (pages faulted in first), in seconds: the
// memory baseline the benchmarks print beside their rates.
double memcpy_seconds(size_t bytes);

}  // namespace lattice::cli
