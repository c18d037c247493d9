// The fp32 FMA peak of one core, measured: the denominator of model-FLOPs utilisation (MFU).
#pragma once

namespace lattice {

// FLOP/s of one thread running independent AVX-512 (or the widest available) FMA chains for
// about `seconds`. Measured once per process and cached.
double measured_fp32_peak_flops_per_thread(double seconds = 0.05);

}  // namespace lattice
