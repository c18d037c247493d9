// lattice::matmul's second library, Intel oneMKL (cblas_sgemm, cblas_gemm_bf16bf16f32), for
// builds that found it (scripts/setup.sh, LATTICE_WITH_MKL). Internal to matmul.cpp, which has
// already checked the arguments; use lattice::matmul with set_gemm_library(GemmLibrary::kMkl).
#pragma once

#include <string>

#include "core/kernel_profile.h"
#include "core/tensor.h"

namespace lattice::mkl_gemm {

// Whether this build links oneMKL.
bool linked();
// "oneMKL 2026.2"; empty when not linked.
std::string library_name();
// The routine that serves the problem, e.g. "mkl:cblas_gemm_bf16bf16f32".
std::string implementation(const GemmProblem& problem);
// out = op(a) @ op(b) [+ bias] or out += op(a) @ op(b), on `threads` threads. The problem has
// non-empty M, N, K and was validated by matmul. Throws ContractError when not linked.
void run(const GemmProblem& problem, int threads, Tensor& out, const Tensor& a, const Tensor& b,
         const Tensor& bias);

}  // namespace lattice::mkl_gemm
