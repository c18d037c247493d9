// oneMKL's GEMMs behind lattice::matmul. Each problem maps onto one CBLAS call on row-major
// operands, transposes as CblasTrans (no copies):
//   f32 x f32 -> f32     cblas_sgemm
//   bf16 x bf16 -> f32   cblas_gemm_bf16bf16f32 (fp32 accumulation)
//   bf16 x bf16 -> bf16  the same into per-thread f32 scratch, rounded once into out
// A bias is broadcast into the f32 destination first and the call adds the product to it
// (beta = 1), as is out when accumulating: one fp32 sum, then one rounding, as with oneDNN.
//
// Reproducibility: MKL may pick different code paths (and so round differently) by memory
// alignment and run; Conditional Numerical Reproducibility (mkl_cbwr_set(MKL_CBWR_AUTO), the
// best path for this CPU, fixed) is set before the first call, so the same problem on the same
// threads gives the same bits from run to run, as Lattice promises for every path.
#include "kernels/matmul_mkl.h"

#include <fmt/format.h>

#include <climits>
#include <vector>

#include "core/error.h"

#if defined(LATTICE_HAVE_MKL)
#include <mkl.h>
#endif

namespace lattice::mkl_gemm {

#if defined(LATTICE_HAVE_MKL)

namespace {

void set_reproducible_once() {
  static const int status = mkl_cbwr_set(MKL_CBWR_AUTO);
  if (status != MKL_CBWR_SUCCESS) {
    LATTICE_THROW(ContractError,
                  "matmul: oneMKL refused conditional numerical reproducibility (mkl_cbwr_set "
                  "returned {}); without it results could differ from run to run",
                  status);
  }
}

MKL_INT checked_int(int64_t v, const char* what) {
  if (v > INT_MAX) {
    LATTICE_THROW(ShapeError,
                  "matmul: {} = {} exceeds oneMKL's 32-bit (LP64) dimensions ---> HINT: use "
                  "train.gemm_library = \"onednn\" for this problem",
                  what, v);
  }
  return MKL_INT(v);
}

}  // namespace

bool linked() {
  return true;
}

std::string library_name() {
  set_reproducible_once();  // before any other oneMKL call, as its documentation asks
  MKLVersion v;
  mkl_get_version(&v);
  // oneMKL's releases are numbered year.update ("Version 2026.2" in its version string).
  return fmt::format("oneMKL {}.{}", v.MajorVersion, v.UpdateVersion);
}

std::string implementation(const GemmProblem& problem) {
  return problem.input == DType::kBF16 ? "mkl:cblas_gemm_bf16bf16f32" : "mkl:cblas_sgemm";
}

void run(const GemmProblem& p, int threads, Tensor& out, const Tensor& a, const Tensor& b,
         const Tensor& bias) {
  set_reproducible_once();
  const MKL_INT m = checked_int(p.m, "M"), n = checked_int(p.n, "N"), k = checked_int(p.k, "K");
  const MKL_INT lda = p.transpose_a ? m : k;
  const MKL_INT ldb = p.transpose_b ? k : n;
  const size_t elements = size_t(p.m) * size_t(p.n);

  // The f32 destination: out itself, or scratch that is rounded into a bf16 out at the end.
  thread_local std::vector<float> scratch;
  float* c = nullptr;
  if (p.output == DType::kF32) {
    c = out.data<float>();
  } else {
    scratch.resize(elements);
    c = scratch.data();
    if (p.accumulate) convert(out.raw_data(), DType::kBF16, c, DType::kF32, int64_t(elements));
  }
  float beta = p.accumulate ? 1.0f : 0.0f;
  if (p.bias) {
    const float* row = bias.data<float>();
    for (int64_t i = 0; i < p.m; ++i) std::copy(row, row + p.n, c + i * p.n);
    beta = 1.0f;
  }

  const int previous_threads = mkl_set_num_threads_local(threads);
  const CBLAS_TRANSPOSE ta = p.transpose_a ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE tb = p.transpose_b ? CblasTrans : CblasNoTrans;
  if (p.input == DType::kF32) {
    cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, 1.0f, a.data<float>(), lda, b.data<float>(), ldb,
                beta, c, n);
  } else {
    cblas_gemm_bf16bf16f32(CblasRowMajor, ta, tb, m, n, k, 1.0f,
                           static_cast<const MKL_BF16*>(a.raw_data()), lda,
                           static_cast<const MKL_BF16*>(b.raw_data()), ldb, beta, c, n);
  }
  mkl_set_num_threads_local(previous_threads);
  if (p.output == DType::kBF16)
    convert(c, DType::kF32, out.raw_data(), DType::kBF16, int64_t(elements));
}

#else  // built without oneMKL

bool linked() {
  return false;
}

std::string library_name() {
  return {};
}

std::string implementation(const GemmProblem&) {
  return {};
}

void run(const GemmProblem&, int, Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  LATTICE_THROW(ContractError,
                "matmul: this build has no oneMKL ---> HINT: run scripts/setup.sh (it unpacks "
                "oneMKL into .deps/) and build again, or use gemm library \"onednn\"");
}

#endif

}  // namespace lattice::mkl_gemm
