#include "kernels/matmul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "core/kernel_profile.h"
#include "core/thread_budget.h"

namespace lattice {
namespace {

// Unit roundoff of fp32 (2^-24): the error bound of a K-term fp32 dot product is about
// K * u * sum |a_ik b_kj| (Higham, "Accuracy and Stability of Numerical Algorithms", 3.1).
constexpr double kF32Unit = 1.0 / (1 << 24);
// Unit roundoff of bf16 (8 significant bits, 2^-8 relative spacing, half of it for rounding).
constexpr double kBF16Unit = 1.0 / (1 << 8);

struct Dims {
  int64_t m, n, k;
};

std::vector<float> random_values(int64_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(count));
  for (float& x : v) x = dist(rng);
  return v;
}

// Holds the storage of one test tensor: fp32 values (the reference reads them) and, for bf16,
// the rounded copy the kernel reads.
struct Matrix {
  std::vector<float> values;
  std::vector<bf16> bf16_values;
  Tensor tensor;

  Matrix(int64_t rows, int64_t cols, DType dtype, uint32_t seed)
      : values(random_values(rows * cols, seed)) {
    if (dtype == DType::kBF16) {
      for (float v : values) bf16_values.push_back(bf16(v));
      tensor = Tensor::borrow(bf16_values.data(), {rows, cols}, dtype);
    } else {
      tensor = Tensor::borrow(values.data(), {rows, cols}, dtype);
    }
  }
  float read(int64_t i) const {
    return bf16_values.empty() ? tensor.data<float>()[i] : float(tensor.data<bf16>()[i]);
  }
};

// Reference out (M, N) in double plus the per-element scale sum_k |a_ik b_kj| (+ |bias| + |out|)
// that rounding errors are proportional to.
struct Reference {
  std::vector<double> value;
  std::vector<double> scale;
};

Reference reference_matmul(const std::vector<float>& a, const std::vector<float>& b,
                           const std::vector<float>* bias, const std::vector<float>* initial,
                           Dims d, MatmulOptions options) {
  Reference r{std::vector<double>(size_t(d.m * d.n)), std::vector<double>(size_t(d.m * d.n))};
  for (int64_t i = 0; i < d.m; ++i) {
    for (int64_t j = 0; j < d.n; ++j) {
      double sum = 0, scale = 0;
      for (int64_t p = 0; p < d.k; ++p) {
        double x = options.transpose_a ? a[size_t(p * d.m + i)] : a[size_t(i * d.k + p)];
        double y = options.transpose_b ? b[size_t(j * d.k + p)] : b[size_t(p * d.n + j)];
        sum += x * y;
        scale += std::abs(x * y);
      }
      if (bias != nullptr) {
        sum += (*bias)[size_t(j)];
        scale += std::abs((*bias)[size_t(j)]);
      }
      if (initial != nullptr) {
        sum += (*initial)[size_t(i * d.n + j)];
        scale += std::abs((*initial)[size_t(i * d.n + j)]);
      }
      r.value[size_t(i * d.n + j)] = sum;
      r.scale[size_t(i * d.n + j)] = scale;
    }
  }
  return r;
}

Shape a_shape(Dims d, MatmulOptions o) {
  return o.transpose_a ? Shape{d.k, d.m} : Shape{d.m, d.k};
}
Shape b_shape(Dims d, MatmulOptions o) {
  return o.transpose_b ? Shape{d.n, d.k} : Shape{d.k, d.n};
}

// Runs matmul on random inputs and checks every element against the double reference:
// |out - ref| <= relative_tolerance * scale (+ output rounding when out is bf16).
void check_matmul(Dims d, DType input, DType output, MatmulOptions options, bool with_bias,
                  double relative_tolerance) {
  SCOPED_TRACE(::testing::Message()
               << "M=" << d.m << " N=" << d.n << " K=" << d.k << " " << dtype_name(input) << "->"
               << dtype_name(output) << " transpose_a=" << options.transpose_a
               << " transpose_b=" << options.transpose_b << " bias=" << with_bias
               << " accumulate=" << options.accumulate);
  Shape as = a_shape(d, options), bs = b_shape(d, options);
  Matrix a(as[0], as[1], input, 1);
  Matrix b(bs[0], bs[1], input, 2);
  Matrix out(d.m, d.n, output, 3);  // random initial values: accumulate adds to them
  std::vector<float> bias_values = random_values(d.n, 4);
  Tensor bias = with_bias ? Tensor::borrow(bias_values.data(), {d.n}, DType::kF32) : Tensor();

  // The reference reads the kernel's own inputs (bf16-rounded when bf16) except where a test
  // asks for the comparison with fp32 inputs, which check_bf16_against_f32 does separately.
  std::vector<float> a_in, b_in, out_in;
  for (int64_t i = 0; i < a.tensor.numel(); ++i) a_in.push_back(a.read(i));
  for (int64_t i = 0; i < b.tensor.numel(); ++i) b_in.push_back(b.read(i));
  for (int64_t i = 0; i < out.tensor.numel(); ++i) out_in.push_back(out.read(i));
  Reference ref = reference_matmul(a_in, b_in, with_bias ? &bias_values : nullptr,
                                   options.accumulate ? &out_in : nullptr, d, options);

  matmul(out.tensor, a.tensor, b.tensor, bias, options);

  for (int64_t i = 0; i < d.m * d.n; ++i) {
    double expected = ref.value[size_t(i)];
    double tolerance = relative_tolerance * ref.scale[size_t(i)] + 1e-30;
    if (output == DType::kBF16) tolerance += kBF16Unit * std::abs(expected);
    ASSERT_NEAR(out.read(i), expected, tolerance) << "element " << i;
  }
}

// fp32: K * u * scale is the worst-case bound; twice it leaves room for oneDNN's blocked
// summation order without letting a wrong term (error ~ scale / K at least) through.
double f32_tolerance(Dims d) {
  return 2.0 * double(d.k + 2) * kF32Unit;
}

const Dims kShapes[] = {{1, 1, 1}, {7, 13, 5}, {16, 24, 33}, {3, 70, 17}};

// Runs a test with `library` chosen for matmul and oneDNN chosen again after it.
class ChosenLibrary {
 public:
  explicit ChosenLibrary(GemmLibrary library) { set_gemm_library(library); }
  ~ChosenLibrary() { set_gemm_library(GemmLibrary::kOneDnn); }
  ChosenLibrary(const ChosenLibrary&) = delete;
  ChosenLibrary& operator=(const ChosenLibrary&) = delete;
};

// Every value test runs once per library this build has (oneDNN; oneMKL where setup found it).
const std::vector<GemmLibrary> kLibraries = available_gemm_libraries();

std::string f32_case_name(
    const ::testing::TestParamInfo<std::tuple<bool, bool, GemmLibrary>>& info) {
  return std::string(std::get<0>(info.param) ? "At" : "A") +
         (std::get<1>(info.param) ? "Bt" : "B") + "_" +
         std::string(gemm_library_key(std::get<2>(info.param)));
}

class MatmulF32 : public ::testing::TestWithParam<std::tuple<bool, bool, GemmLibrary>> {
 protected:
  ChosenLibrary library_{std::get<2>(GetParam())};
};

TEST_P(MatmulF32, MatchesDoubleReferenceForEveryShape) {
  auto [transpose_a, transpose_b, library] = GetParam();
  for (Dims d : kShapes) {
    for (bool with_bias : {false, true}) {
      check_matmul(d, DType::kF32, DType::kF32, {transpose_a, transpose_b, false}, with_bias,
                   f32_tolerance(d));
    }
  }
}

TEST_P(MatmulF32, AccumulateAddsToOut) {
  auto [transpose_a, transpose_b, library] = GetParam();
  for (Dims d : kShapes) {
    check_matmul(d, DType::kF32, DType::kF32, {transpose_a, transpose_b, true}, false,
                 f32_tolerance(d));
  }
}

INSTANTIATE_TEST_SUITE_P(Transposes, MatmulF32,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool(),
                                            ::testing::ValuesIn(kLibraries)),
                         f32_case_name);

std::string bf16_case_name(
    const ::testing::TestParamInfo<std::tuple<bool, bool, DType, GemmLibrary>>& info) {
  auto [transpose_a, transpose_b, output, library] = info.param;
  return std::string(transpose_a ? "At" : "A") + (transpose_b ? "Bt" : "B") + "_out_" +
         std::string(dtype_name(output)) + "_" + std::string(gemm_library_key(library));
}

class MatmulBF16 : public ::testing::TestWithParam<std::tuple<bool, bool, DType, GemmLibrary>> {
 protected:
  ChosenLibrary library_{std::get<3>(GetParam())};
};

// On bf16 inputs the kernel multiplies exactly and sums in fp32, so against a reference that
// reads the same (rounded) inputs the fp32 bound holds. Accumulating in bf16 instead would miss
// it by orders of magnitude at K = 512.
TEST_P(MatmulBF16, AccumulatesInFp32) {
  auto [transpose_a, transpose_b, output, library] = GetParam();
  for (Dims d : {Dims{1, 1, 1}, Dims{7, 13, 5}, Dims{5, 9, 512}}) {
    check_matmul(d, DType::kBF16, output, {transpose_a, transpose_b, false}, true,
                 f32_tolerance(d));
    check_matmul(d, DType::kBF16, output, {transpose_a, transpose_b, true}, false,
                 f32_tolerance(d));
  }
}

// bf16 against the fp32 product of the unrounded inputs. Tolerance 2^-8 * sum |a b|: each input
// is rounded to 8 significant bits (relative error <= 2^-9), so each product is off by at most
// ~2 * 2^-9 = 2^-8 relative; the fp32 accumulation adds only K * 2^-24, and a bf16 out adds one
// more rounding of 2^-8 |ref| (added in check). The bound is linear in sum |a b|, not in K.
TEST_P(MatmulBF16, StaysWithinBf16RoundingOfFp32) {
  auto [transpose_a, transpose_b, output, library] = GetParam();
  Dims d{6, 11, 96};
  MatmulOptions options{transpose_a, transpose_b, false};
  Shape as = a_shape(d, options), bs = b_shape(d, options);
  Matrix a32(as[0], as[1], DType::kF32, 5), b32(bs[0], bs[1], DType::kF32, 6);
  Matrix a16(as[0], as[1], DType::kBF16, 5), b16(bs[0], bs[1], DType::kBF16, 6);
  Matrix out32(d.m, d.n, DType::kF32, 7), out16(d.m, d.n, output, 7);
  matmul(out32.tensor, a32.tensor, b32.tensor, Tensor(), options);
  matmul(out16.tensor, a16.tensor, b16.tensor, Tensor(), options);
  Reference ref = reference_matmul(a32.values, b32.values, nullptr, nullptr, d, options);
  double max_error = 0;
  for (int64_t i = 0; i < d.m * d.n; ++i) {
    double expected = out32.read(i);
    // Both sides also carry their own fp32 summation error, K * u * scale each.
    double tolerance = (kBF16Unit + 2.0 * double(d.k + 2) * kF32Unit) * ref.scale[size_t(i)];
    if (output == DType::kBF16) tolerance += kBF16Unit * std::abs(expected);
    double error = std::abs(out16.read(i) - expected);
    max_error = std::max(max_error, error / ref.scale[size_t(i)]);
    ASSERT_LE(error, tolerance) << "element " << i;
  }
  // The inputs really were rounded: a bf16 result identical to fp32 would mean no bf16 ran.
  EXPECT_GT(max_error, 0.0);
}

INSTANTIATE_TEST_SUITE_P(TransposesAndOutputs, MatmulBF16,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool(),
                                            ::testing::Values(DType::kF32, DType::kBF16),
                                            ::testing::ValuesIn(kLibraries)),
                         bf16_case_name);

// The library chosen is the one that runs: its name and routine are what the reports print, and
// its results differ from oneDNN's in the last bits (another summation order) while each is
// reproducible call to call.
TEST(MatmulLibraries, TheChosenLibraryRunsAndRepeatsItsBits) {
#if defined(LATTICE_HAVE_MKL)
  ASSERT_EQ(kLibraries.size(), 2u) << "this build linked oneMKL, so matmul must offer it";
#else
  ASSERT_EQ(kLibraries.size(), 1u);
#endif
  EXPECT_EQ(kLibraries.front(), GemmLibrary::kOneDnn);
  EXPECT_EQ(gemm_library(), GemmLibrary::kOneDnn) << "oneDNN is the default";
  const Dims d{33, 40, 1500};
  Matrix a(d.m, d.k, DType::kF32, 11), b(d.k, d.n, DType::kF32, 12);
  std::vector<std::vector<float>> results;
  for (GemmLibrary library : kLibraries) {
    ChosenLibrary chosen(library);
    EXPECT_EQ(matmul_library_name(), gemm_library_name(library));
    const std::string routine = matmul_implementation(8, 8, 8, DType::kBF16, DType::kF32);
    if (library == GemmLibrary::kMkl) {
      EXPECT_EQ(routine, "mkl:cblas_gemm_bf16bf16f32");
      EXPECT_EQ(matmul_library_name().rfind("oneMKL 20", 0), 0u) << matmul_library_name();
    } else {
      EXPECT_EQ(routine.find("mkl"), std::string::npos) << routine;
      EXPECT_EQ(matmul_library_name().rfind("oneDNN ", 0), 0u) << matmul_library_name();
    }
    Matrix first(d.m, d.n, DType::kF32, 13), second(d.m, d.n, DType::kF32, 14);
    matmul(first.tensor, a.tensor, b.tensor);
    matmul(second.tensor, a.tensor, b.tensor);
    EXPECT_EQ(first.values, second.values) << gemm_library_key(library);
    results.push_back(first.values);
  }
  if (results.size() == 2) {
    // Equal bits from both would mean the choice was ignored.
    EXPECT_NE(results[0], results[1]) << "oneMKL gave oneDNN's bits for a 1500-term sum";
  }
}

TEST(MatmulLibraries, NamesParseAndUnknownOnesAreRefused) {
  EXPECT_EQ(parse_gemm_library("onednn"), GemmLibrary::kOneDnn);
  EXPECT_EQ(gemm_library_key(GemmLibrary::kMkl), "mkl");
  try {
    parse_gemm_library("cublas");
    ADD_FAILURE() << "no exception for an unknown library";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("onednn, mkl"), std::string::npos) << e.what();
  }
#if defined(LATTICE_HAVE_MKL)
  EXPECT_EQ(parse_gemm_library("mkl"), GemmLibrary::kMkl);
#else
  EXPECT_THROW(parse_gemm_library("mkl"), ValueError);
  EXPECT_THROW(set_gemm_library(GemmLibrary::kMkl), ValueError);
#endif
}

// In-process ranks call matmul at once on their own threads; with oneMKL each call runs on the
// caller's thread budget (mkl_set_num_threads_local), as oneDNN's primitives do.
TEST(MatmulLibraries, ConcurrentRankThreadsGetCorrectResultsInEveryLibrary) {
  for (GemmLibrary library : kLibraries) {
    ChosenLibrary chosen(library);
    auto rank = [](int index, double* max_error) {
      set_thread_budget(1);
      Dims d{9 + index, 14, 31};
      Matrix a(d.m, d.k, DType::kBF16, 50 + index), b(d.k, d.n, DType::kBF16, 60 + index);
      Matrix out(d.m, d.n, DType::kBF16, 70);
      std::vector<float> a_in, b_in;
      for (int64_t i = 0; i < a.tensor.numel(); ++i) a_in.push_back(a.read(i));
      for (int64_t i = 0; i < b.tensor.numel(); ++i) b_in.push_back(b.read(i));
      Reference ref = reference_matmul(a_in, b_in, nullptr, nullptr, d, {});
      *max_error = 0;
      for (int call = 0; call < 20; ++call) {
        matmul(out.tensor, a.tensor, b.tensor);
        for (int64_t i = 0; i < d.m * d.n; ++i) {
          double error = std::abs(out.read(i) - ref.value[size_t(i)]) / ref.scale[size_t(i)];
          *max_error = std::max(*max_error, error);
        }
      }
    };
    double max_error[2] = {1, 1};
    std::thread first(rank, 0, &max_error[0]);
    std::thread second(rank, 1, &max_error[1]);
    first.join();
    second.join();
    for (int r = 0; r < 2; ++r) {
      // One bf16 rounding of the output on top of the fp32 sum.
      EXPECT_LE(max_error[r], kBF16Unit + 2 * 33 * kF32Unit)
          << gemm_library_key(library) << " rank " << r;
    }
  }
}

TEST(Matmul, WritesOnlyTheOutRowsOfAView) {
  // out is rows [1, 3) of a (4, 5) buffer; rows 0 and 3 must keep their sentinels.
  std::vector<float> buffer(20, 42.0f);
  Tensor whole = Tensor::borrow(buffer.data(), {4, 5}, DType::kF32);
  Tensor out = whole.slice_rows(1, 3);
  Matrix a(2, 3, DType::kF32, 8), b(3, 5, DType::kF32, 9);
  matmul(out, a.tensor, b.tensor);
  for (int j = 0; j < 5; ++j) {
    EXPECT_EQ(buffer[size_t(j)], 42.0f);
    EXPECT_EQ(buffer[size_t(15 + j)], 42.0f);
    double expected = 0;
    for (int p = 0; p < 3; ++p)
      expected += double(a.values[size_t(p)]) * b.values[size_t(p * 5 + j)];
    EXPECT_NEAR(buffer[size_t(5 + j)], expected, 1e-6);
  }
}

TEST(Matmul, EmptyDimensions) {
  std::vector<float> bias_values = {1.5f, -2.0f, 3.0f};
  Tensor bias = Tensor::borrow(bias_values.data(), {3}, DType::kF32);
  Tensor empty_a = Tensor::borrow(nullptr, {2, 0}, DType::kF32);
  Tensor empty_b = Tensor::borrow(nullptr, {0, 3}, DType::kF32);

  // K == 0: out = bias broadcast over rows, or zeros, or unchanged when accumulating.
  std::vector<float> out_values(6, 9.0f);
  Tensor out = Tensor::borrow(out_values.data(), {2, 3}, DType::kF32);
  matmul(out, empty_a, empty_b, bias);
  EXPECT_EQ(out_values, (std::vector<float>{1.5f, -2.0f, 3.0f, 1.5f, -2.0f, 3.0f}));
  matmul(out, empty_a, empty_b, Tensor(), {.accumulate = true});
  EXPECT_EQ(out_values, (std::vector<float>{1.5f, -2.0f, 3.0f, 1.5f, -2.0f, 3.0f}));
  matmul(out, empty_a, empty_b);
  EXPECT_EQ(out_values, std::vector<float>(6, 0.0f));

  std::vector<bf16> out16_values(6, bf16(9.0f));
  Tensor out16 = Tensor::borrow(out16_values.data(), {2, 3}, DType::kBF16);
  Tensor empty_a16 = Tensor::borrow(nullptr, {2, 0}, DType::kBF16);
  Tensor empty_b16 = Tensor::borrow(nullptr, {0, 3}, DType::kBF16);
  matmul(out16, empty_a16, empty_b16, bias);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(float(out16_values[size_t(i)]), bias_values[size_t(i % 3)]);

  // M == 0 or N == 0: nothing to write, and no error.
  Matrix a(0, 4, DType::kF32, 10), b(4, 3, DType::kF32, 11);
  Tensor no_rows = Tensor::borrow(nullptr, {0, 3}, DType::kF32);
  EXPECT_NO_THROW(matmul(no_rows, a.tensor, b.tensor, bias));
  Matrix a2(2, 4, DType::kF32, 12), b2(4, 0, DType::kF32, 13);
  Tensor no_cols = Tensor::borrow(nullptr, {2, 0}, DType::kF32);
  EXPECT_NO_THROW(matmul(no_cols, a2.tensor, b2.tensor));
}

TEST(Matmul, SecondCallOfOneProblemHitsTheCache) {
  // The key holds the OpenMP team size; start from a known budget so the change below is one.
  set_thread_budget(1);
  matmul_cache_clear();
  Matrix a(4, 6, DType::kF32, 1), b(6, 5, DType::kF32, 2), out(4, 5, DType::kF32, 3);
  matmul(out.tensor, a.tensor, b.tensor);
  EXPECT_EQ(matmul_cache_stats().created, 1);
  EXPECT_EQ(matmul_cache_stats().hits, 0);
  matmul(out.tensor, a.tensor, b.tensor);
  EXPECT_EQ(matmul_cache_stats().created, 1);
  EXPECT_EQ(matmul_cache_stats().hits, 1);

  // Each part of the key makes a new problem: transposes, accumulate, bias, dtype, threads.
  Tensor a_t = a.tensor.view({6, 4});
  matmul(out.tensor, a_t, b.tensor, Tensor(), {.transpose_a = true});
  matmul(out.tensor, a.tensor, b.tensor, Tensor(), {.accumulate = true});
  std::vector<float> bias_values(5, 1.0f);
  matmul(out.tensor, a.tensor, b.tensor, Tensor::borrow(bias_values.data(), {5}, DType::kF32));
  Matrix a16(4, 6, DType::kBF16, 1), b16(6, 5, DType::kBF16, 2);
  matmul(out.tensor, a16.tensor, b16.tensor);
  EXPECT_EQ(matmul_cache_stats().created, 5);
  set_thread_budget(2);
  matmul(out.tensor, a.tensor, b.tensor);
  set_thread_budget(1);
  EXPECT_EQ(matmul_cache_stats().created, 6);
  matmul(out.tensor, a.tensor, b.tensor);
  EXPECT_EQ(matmul_cache_stats().created, 6);
  EXPECT_EQ(matmul_cache_stats().hits, 2);

  matmul_cache_clear();
  EXPECT_EQ(matmul_cache_stats().created, 0);
  EXPECT_EQ(matmul_cache_stats().hits, 0);
}

TEST(Matmul, ConcurrentRankThreadsKeepTheirOwnCaches) {
  // Two "ranks", each with its own thread budget and problem, calling matmul at the same time.
  constexpr int kCalls = 20;
  auto rank = [](int index, MatmulCacheStats* stats, double* max_error) {
    set_thread_budget(1);
    Dims d{9 + index, 14, 31};
    Matrix a(d.m, d.k, DType::kF32, 20 + index), b(d.k, d.n, DType::kF32, 30 + index);
    Matrix out(d.m, d.n, DType::kF32, 40);
    Reference ref = reference_matmul(a.values, b.values, nullptr, nullptr, d, {});
    *max_error = 0;
    for (int call = 0; call < kCalls; ++call) {
      matmul(out.tensor, a.tensor, b.tensor);
      for (int64_t i = 0; i < d.m * d.n; ++i) {
        double error = std::abs(out.read(i) - ref.value[size_t(i)]) / ref.scale[size_t(i)];
        *max_error = std::max(*max_error, error);
      }
    }
    *stats = matmul_cache_stats();
  };
  MatmulCacheStats stats[2];
  double max_error[2] = {1, 1};
  std::thread first(rank, 0, &stats[0], &max_error[0]);
  std::thread second(rank, 1, &stats[1], &max_error[1]);
  first.join();
  second.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(stats[r].created, 1) << "rank " << r;
    EXPECT_EQ(stats[r].hits, kCalls - 1) << "rank " << r;
    EXPECT_LE(max_error[r], 2 * 33 * kF32Unit) << "rank " << r;
  }
}

TEST(Matmul, BooksEachProblemUnderTheCallersProfiledRole) {
  Matrix a(4, 6, DType::kF32, 1), b(5, 6, DType::kF32, 2), out(4, 5, DType::kF32, 3);
  KernelProfile profile;
  {
    const ScopedKernelProfile scope(profile);
    const KernelTimer role("gemm mlp.c_fc fwd", 2.0 * 4 * 5 * 6, 0);
    matmul(out.tensor, a.tensor, b.tensor, Tensor(), {.transpose_b = true});
    matmul(out.tensor, a.tensor, b.tensor, Tensor(), {.transpose_b = true, .accumulate = true});
  }
  {
    const ScopedKernelProfile scope(profile);
    matmul(out.tensor, a.tensor, b.tensor, Tensor(), {.transpose_b = true});  // no role
  }
  const auto& booked = profile.totals().find("gemm mlp.c_fc fwd")->second.gemm_problems;
  ASSERT_EQ(booked.size(), 2u);  // the accumulating call is another problem
  const GemmProblem plain{.m = 4, .k = 6, .n = 5, .transpose_b = true};
  ASSERT_TRUE(booked.contains(plain));
  EXPECT_EQ(booked.at(plain), 1);
  const auto& other = profile.totals().find("gemm (other)")->second;
  EXPECT_EQ(other.calls, 1);
  EXPECT_EQ(other.gemm_problems.at(plain), 1);
  EXPECT_NE(matmul_library_name().find("oneDNN "), std::string::npos);
}

TEST(Matmul, ReportsTheOneDnnImplementation) {
  std::string f32 = matmul_implementation(64, 64, 64, DType::kF32, DType::kF32);
  std::string bf16_impl = matmul_implementation(64, 64, 64, DType::kBF16, DType::kBF16);
  EXPECT_FALSE(f32.empty());
  EXPECT_FALSE(bf16_impl.empty());
  // A reference (scalar) kernel for f32 would be a silent 100x slowdown on any x86-64 CPU.
  EXPECT_EQ(f32.find("ref"), std::string::npos) << f32;
  ::testing::Test::RecordProperty("f32_implementation", f32);
  ::testing::Test::RecordProperty("bf16_implementation", bf16_impl);
  EXPECT_THROW(matmul_implementation(64, 64, 64, DType::kF32, DType::kBF16), DTypeError);
  EXPECT_THROW(matmul_implementation(0, 64, 64, DType::kF32, DType::kF32), ValueError);
}

// Expects `call` to throw E with a message naming matmul and `argument`.
template <class E, class F>
void expect_error(F call, const std::string& argument) {
  try {
    call();
    ADD_FAILURE() << "no exception; expected one naming '" << argument << "'";
  } catch (const E& e) {
    std::string message = e.what();
    EXPECT_NE(message.find("matmul"), std::string::npos) << message;
    EXPECT_NE(message.find("'" + argument + "'"), std::string::npos) << message;
  }
}

TEST(Matmul, RejectsBadArguments) {
  Matrix a(4, 6, DType::kF32, 1), b(6, 5, DType::kF32, 2), out(4, 5, DType::kF32, 3);
  Matrix a16(4, 6, DType::kBF16, 1), b16(6, 5, DType::kBF16, 2), out16(4, 5, DType::kBF16, 3);
  std::vector<float> bias_values(5, 0.0f), wrong_bias_values(4, 0.0f);
  Tensor bias = Tensor::borrow(bias_values.data(), {5}, DType::kF32);

  // Shapes: inner dimension, out, rank, bias, and a transpose flag that makes them disagree.
  Matrix b_wrong_k(7, 5, DType::kF32, 4);
  expect_error<ShapeError>([&] { matmul(out.tensor, a.tensor, b_wrong_k.tensor); }, "a");
  expect_error<ShapeError>(
      [&] { matmul(out.tensor, a.tensor, b.tensor, Tensor(), {.transpose_b = true}); }, "b");
  Matrix out_wrong(5, 4, DType::kF32, 5);
  expect_error<ShapeError>([&] { matmul(out_wrong.tensor, a.tensor, b.tensor); }, "out");
  Tensor a3 = a.tensor.view({2, 2, 6});
  expect_error<ShapeError>([&] { matmul(out.tensor, a3, b.tensor); }, "a");
  expect_error<ShapeError>(
      [&] {
        matmul(out.tensor, a.tensor, b.tensor,
               Tensor::borrow(wrong_bias_values.data(), {4}, DType::kF32));
      },
      "bias");

  // Dtypes: mixed inputs, f32 inputs into bf16 out, unsupported dtypes, bf16 bias.
  expect_error<DTypeError>([&] { matmul(out.tensor, a.tensor, b16.tensor); }, "b");
  expect_error<DTypeError>([&] { matmul(out16.tensor, a.tensor, b.tensor); }, "out");
  std::vector<int32_t> ints(24, 1);
  Tensor a_int = Tensor::borrow(ints.data(), {4, 6}, DType::kI32);
  expect_error<DTypeError>([&] { matmul(out.tensor, a_int, b.tensor); }, "a");
  std::vector<bf16> bias16_values(5);
  expect_error<DTypeError>(
      [&] {
        matmul(out.tensor, a16.tensor, b16.tensor,
               Tensor::borrow(bias16_values.data(), {5}, DType::kBF16));
      },
      "bias");

  // Values: undefined tensors, bias with accumulate, out aliasing an input.
  expect_error<ValueError>([&] { matmul(out.tensor, Tensor(), b.tensor); }, "a");
  expect_error<ValueError>([&] { matmul(out.tensor, a.tensor, Tensor()); }, "b");
  Tensor undefined;
  expect_error<ValueError>([&] { matmul(undefined, a.tensor, b.tensor); }, "out");
  expect_error<ValueError>(
      [&] { matmul(out.tensor, a.tensor, b.tensor, bias, {.accumulate = true}); }, "bias");
  Matrix square(4, 4, DType::kF32, 6), square_out(4, 4, DType::kF32, 7);
  expect_error<ValueError>([&] { matmul(square.tensor, square.tensor, square_out.tensor); }, "a");
}

}  // namespace
}  // namespace lattice
