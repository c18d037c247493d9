// `lattice bench train` and `lattice bench calibrate`.
//
//   lattice bench train --preset gpt2-124m --batch 4 --seq 256 --steps 5 --threads 1,2
//       --precision fp32,bf16 [--gemm-library onednn,mkl] [--profile]
// times full training steps (forward + backward + clip + AdamW, random tokens) per GEMM library ×
// precision × thread count and reports tokens/s, ms/step (median), model FLOP/s (6·N + 12·L·C·T per
// token) and their fraction of the bf16 GEMM ceiling measured in the same run on the same threads.
//
//   lattice bench calibrate --out cluster_profile.json [--threads 1] [--quick]
// measures GEMM throughput by shape and precision, memcpy bandwidth and the in-process
// collectives' α and bus bandwidth per group size, and writes a cluster profile that
// `lattice plan --cluster cluster_profile.json` reads (docs/planner.md, Calibration), and the
// tuner's α-β per collective, algorithm and group size (--comm-out, default
// cluster_profile.comm.json) that `lattice train --set parallel.comm_profile=FILE` reads.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cli/bench_parent.h"
#include "cli/bench_util.h"
#include "cli/commands.h"
#include "cli/validators.h"
#include "comm/cost_model.h"
#include "comm/thread_world.h"
#include "core/cpu_peak.h"
#include "core/error.h"
#include "core/kernel_profile.h"
#include "core/thread_budget.h"
#include "core/timer.h"
#include "kernels/matmul.h"
#include "plan/calibration.h"
#include "plan/cluster_profile.h"
#include "train/train_benchmark.h"

namespace lattice::cli {
namespace {

struct BenchTrainArgs {
  std::string preset = "gpt2-124m";
  int64_t batch = 4;
  int64_t seq = 256;
  int steps = 5;
  int warmup = 2;
  std::vector<int> threads;  // empty: 1 and all available cores
  std::vector<std::string> precisions{"fp32", "bf16"};
  std::vector<int64_t> ceiling_shape{4096, 768, 3072};  // M, K, N of the bf16 GEMM ceiling
  int gemm_repeats = 5;
  bool profile = false;  // --profile: each row's step split into its kernels
  std::vector<std::string> gemm_libraries{"onednn"};  // matmul's library, one row set each
};

// Each byte read once and written once.
double memcpy_traffic_bytes_per_s(size_t bytes) {
  return 2.0 * double(bytes) / memcpy_seconds(bytes);
}

// The ceiling of one shape and dtype on `threads`: the fastest rate among the GEMM libraries
// this build has (best of `repeats` calls each), and each library's rate for the report, e.g.
// "431.7 GFLOP/s (oneDNN 2.6.3), 190.2 GFLOP/s (oneMKL 2026.2)". On a CPU whose tiles only one
// library drives, the fastest is that library's.
double fastest_library_rate(const GemmShape& shape, DType dtype, int threads, int repeats,
                            std::string& per_library) {
  const GemmProblem problem{
      .m = shape.m, .k = shape.k, .n = shape.n, .input = dtype, .output = dtype};
  double best = 0;
  per_library.clear();
  for (const auto& [library, seconds] :
       measure_gemm_seconds_per_library(problem, threads, repeats)) {
    const double flops = problem.flops() / seconds;
    per_library += fmt::format("{}{:.1f} GFLOP/s ({})", per_library.empty() ? "" : ", ",
                               flops / 1e9, gemm_library_name(library));
    best = std::max(best, flops);
  }
  return best;
}

// One GEMM problem timed alone: the fastest library's seconds per call, which library that
// was, and each library's rate.
struct GemmAlone {
  double seconds = 0;
  GemmLibrary fastest = GemmLibrary::kOneDnn;
  std::map<GemmLibrary, double> gflops;
};

// Each distinct GEMM problem of the profiled kernels timed alone in every library this build has
// (oneDNN; oneMKL where setup found it), on the same threads, best of `repeats` each: "the best
// rate any available library reaches" for the problem. Kernels without GEMMs through
// lattice::matmul (attention's own tiles, the memory-bound ones) have none.
std::map<GemmProblem, GemmAlone> gemm_seconds_alone(const KernelProfile& profile, int threads,
                                                    int repeats) {
  std::map<GemmProblem, GemmAlone> alone;
  for (const auto& [name, t] : profile.totals()) {
    for (const auto& [problem, calls] : t.gemm_problems) {
      if (problem.m == 0 || problem.k == 0 || problem.n == 0 || alone.contains(problem)) continue;
      GemmAlone entry;
      for (const auto& [library, seconds] :
           measure_gemm_seconds_per_library(problem, threads, repeats)) {
        entry.gflops[library] = problem.flops() / seconds / 1e9;
        if (entry.seconds == 0 || seconds < entry.seconds) {
          entry.seconds = seconds;
          entry.fastest = library;
        }
      }
      alone.emplace(problem, entry);
    }
  }
  return alone;
}

// The seconds a kernel's GEMMs take alone in the fastest library (0: none).
double kernel_seconds_alone(const KernelTotals& t, const std::map<GemmProblem, GemmAlone>& alone) {
  double seconds = 0;
  for (const auto& [problem, calls] : t.gemm_problems) {
    if (auto it = alone.find(problem); it != alone.end()) {
      seconds += double(calls) * it->second.seconds;
    }
  }
  return seconds;
}

// One line per (kernel, problem), key=value, for a script to pose the same problems to another
// library (bench/compare_pytorch.py --gemms).
void print_gemm_problems(const KernelProfile& profile, int steps,
                         const std::map<GemmProblem, GemmAlone>& alone) {
  for (const auto& [name, t] : profile.totals()) {
    for (const auto& [problem, calls] : t.gemm_problems) {
      auto it = alone.find(problem);
      if (it == alone.end()) continue;
      std::string per_library;
      for (const auto& [library, gflops] : it->second.gflops) {
        per_library += fmt::format(" {}_gflops={:.1f}", gemm_library_key(library), gflops);
      }
      fmt::print(
          "# gemm-problem role=\"{}\" m={} k={} n={} transpose_a={:d} transpose_b={:d} "
          "accumulate={:d} bias={:d} input={} output={} calls_per_step={:g} alone_gflops={:.1f} "
          "alone_library={}{}\n",
          name, problem.m, problem.k, problem.n, problem.transpose_a, problem.transpose_b,
          problem.accumulate, problem.bias, dtype_name(problem.input), dtype_name(problem.output),
          double(calls) / steps, problem.flops() / it->second.seconds / 1e9,
          gemm_library_key(it->second.fastest), per_library);
    }
  }
}

// "oneDNN 2.6.3 on 14 problems, oneMKL 2026.2 on 1": which library was fastest alone, how often.
std::string fastest_libraries(const std::map<GemmProblem, GemmAlone>& alone) {
  std::map<GemmLibrary, int> wins;
  for (const auto& [problem, entry] : alone) ++wins[entry.fastest];
  std::string out;
  for (const auto& [library, count] : wins) {
    out += fmt::format("{}{} on {} problem{}", out.empty() ? "" : ", ", gemm_library_name(library),
                       count, count == 1 ? "" : "s");
  }
  return out;
}

// The timed steps' kernels, slowest first: time per step and share of the step, the rate each
// reached against its roof (GEMM-like kernels: FLOP/s against this precision's GEMM ceiling of
// the same run; the others: bytes/s against memcpy's), each GEMM's rate against the same
// problems run alone, and the step's time no kernel holds.
void print_kernel_profile(const KernelProfile& profile, int steps, double step_ms,
                          double gemm_ceiling, double memory_roof,
                          const std::map<GemmProblem, GemmAlone>& alone) {
  std::vector<std::pair<std::string, KernelTotals>> rows(profile.totals().begin(),
                                                         profile.totals().end());
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  fmt::print("#   {:<34} {:>10} {:>9} {:>7} {:>10} {:>8} {:>7} {:>10} {:>8}\n", "kernel",
             "calls/step", "ms/step", "share", "rate", "unit", "roof", "alone", "vs alone");
  double kernel_ms = 0, gemm_seconds = 0, gemm_alone = 0;
  std::string slowest;
  double slowest_fraction = 2;
  for (const auto& [name, t] : rows) {
    const double ms = 1e3 * t.seconds / steps;
    kernel_ms += ms;
    const bool compute = t.flops > 0;
    const double rate = t.seconds > 0 ? (compute ? t.flops : t.bytes) / t.seconds / 1e9 : 0;
    const double roof = compute ? gemm_ceiling : memory_roof;
    std::string alone_columns;
    if (const double seconds_alone = kernel_seconds_alone(t, alone);
        seconds_alone > 0 && t.seconds > 0) {
      const double fraction = seconds_alone / t.seconds;
      alone_columns =
          fmt::format(" {:>10.1f} {:>7.0f}%", t.flops / seconds_alone / 1e9, 100 * fraction);
      gemm_seconds += t.seconds;
      gemm_alone += seconds_alone;
      if (fraction < slowest_fraction) {
        slowest_fraction = fraction;
        slowest = name;
      }
    }
    fmt::print("#   {:<34} {:>10.1f} {:>9.2f} {:>6.1f}% {:>10.1f} {:>8} {:>6.0f}%{}\n", name,
               double(t.calls) / steps, ms, 100 * ms / step_ms, rate, compute ? "GFLOP/s" : "GB/s",
               roof > 0 ? 100 * rate * 1e9 / roof : 0.0, alone_columns);
  }
  fmt::print(
      "#   {:<34} {:>10} {:>9.2f} {:>6.1f}%   (outside any timed kernel: the optimizer's "
      "loop, gradient zeroing, bookkeeping)\n",
      "other", "", step_ms - kernel_ms, 100 * (step_ms - kernel_ms) / step_ms);
  if (gemm_seconds > 0) {
    fmt::print(
        "# the step's GEMMs ({}) ran at {:.0f}% of the same problems' rate alone in the fastest "
        "library (same threads, best of the repeats; fastest: {}); the slowest against its "
        "own: {} at {:.0f}%\n",
        matmul_library_name(), 100 * gemm_alone / gemm_seconds, fastest_libraries(alone), slowest,
        100 * slowest_fraction);
    print_gemm_problems(profile, steps, alone);
  }
}

void run_bench_train(BenchTrainArgs args) {
  if (args.threads.empty()) {
    args.threads = {1};
    if (available_cores() > 1) args.threads.push_back(available_cores());
  }
  if (args.ceiling_shape.size() != 3) {
    LATTICE_THROW(ValueError, "--ceiling-shape takes M K N, got {} numbers",
                  args.ceiling_shape.size());
  }
  const GemmShape ceiling_shape{args.ceiling_shape[0], args.ceiling_shape[1],
                                args.ceiling_shape[2]};
  std::vector<GemmLibrary> libraries;
  for (const std::string& key : args.gemm_libraries) libraries.push_back(parse_gemm_library(key));
  TrainBenchmarkConfig config;
  config.model = model_preset(args.preset);
  config.batch = args.batch;
  config.seq = args.seq;
  config.steps = args.steps;
  config.warmup_steps = args.warmup;
  const int64_t tokens_per_step = args.batch * args.seq;

  fmt::print("# lattice bench train: {} B={} T={} ({} tokens/step), {} warm-up + {} timed steps\n",
             args.preset, args.batch, args.seq, tokens_per_step, args.warmup, args.steps);
  fmt::print("# machine at start: {}\n", machine_state());
  fmt::print("# model FLOPs/token = 6*N + 12*L*C*T (PaLM, full attention)\n");
  fmt::print(
      "# baseline (same run): bf16 lattice::matmul M={} K={} N={}, best of {}, in each GEMM "
      "library; %ceiling is against the fastest\n",
      ceiling_shape.m, ceiling_shape.k, ceiling_shape.n, args.gemm_repeats);
  std::vector<double> ceiling;
  for (int t : args.threads) {
    std::string per_library;
    ceiling.push_back(
        fastest_library_rate(ceiling_shape, DType::kBF16, t, args.gemm_repeats, per_library));
    fmt::print("#   {} thread(s): {}\n", t, per_library);
  }
  // What the cores could do, beside what the GEMMs reach: the vector bf16 peak, and whether
  // AMX tiles (the target unit) are there at all.
  const double bf16_peak = measured_bf16_peak_flops_per_thread();
  fmt::print("# bf16 arithmetic peak, measured: {}; AMX-BF16: {}\n",
             bf16_peak > 0 ? fmt::format("{:.1f} GFLOP/s per core (VDPBF16PS)", bf16_peak / 1e9)
                           : std::string("no AVX512-BF16 on this CPU"),
             has_amx_bf16() ? "present, its tile peak not measured (no AMX loop in Lattice yet)"
                            : "absent on this CPU");
  // --profile: each precision's own GEMM ceiling, and memcpy's traffic as the memory roof.
  std::map<std::string, std::vector<double>> profile_ceiling;
  double memory_roof = 0;
  if (args.profile) {
    for (const std::string& precision : args.precisions) {
      if (precision == "bf16") {
        profile_ceiling[precision] = ceiling;
        continue;
      }
      for (int t : args.threads) {
        std::string per_library;
        profile_ceiling[precision].push_back(fastest_library_rate(
            ceiling_shape, parse_precision(precision), t, args.gemm_repeats, per_library));
        fmt::print("# profile roof: {} GEMM ceiling, {} thread(s): {}\n", precision, t,
                   per_library);
      }
    }
    memory_roof = memcpy_traffic_bytes_per_s(size_t(256) << 20);
    fmt::print("# profile roof: memcpy of 256 MiB, {:.1f} GB/s (read + write)\n",
               memory_roof / 1e9);
  }
  fmt::print("# {:>9} {:>7} {:>9} {:>9} {:>9} {:>9} {:>12} {:>9} {:>16} {}\n", "precision",
             "threads", "ms/step", "min ms", "max ms", "tok/s", "model GF/s", "%ceiling",
             "loss first->last", "gemms");
  for (const GemmLibrary library : libraries) {
    config.gemm_library = library;
    for (const std::string& precision : args.precisions) {
      config.precision = parse_precision(precision);
      for (size_t i = 0; i < args.threads.size(); ++i) {
        config.threads = args.threads[i];
        KernelProfile profile;
        config.profile = args.profile ? &profile : nullptr;
        const TrainBenchmarkResult r = run_train_benchmark(config);
        const double tokens_per_s = r.tokens_per_s(tokens_per_step);
        const double model_flops = tokens_per_s * r.flops_per_token;
        fmt::print(
            "  {:>9} {:>7} {:>9.1f} {:>9.1f} {:>9.1f} {:>9.1f} {:>12.1f} {:>8.1f}% "
            "{:>7.3f}->{:.3f} {}\n",
            precision, config.threads, r.median_ms(),
            *std::min_element(r.step_ms.begin(), r.step_ms.end()),
            *std::max_element(r.step_ms.begin(), r.step_ms.end()), tokens_per_s, model_flops / 1e9,
            100 * model_flops / ceiling[i], r.losses.front(), r.losses.back(),
            gemm_library_key(library));
        if (args.profile) {
          double total_ms = 0;
          for (const double ms : r.step_ms) total_ms += ms;
          fmt::print("# profile of the {} {} thread(s) {} row: mean of {} timed steps, {:.1f} ms\n",
                     precision, config.threads, gemm_library_key(library), r.step_ms.size(),
                     total_ms / r.step_ms.size());
          print_kernel_profile(profile, int(r.step_ms.size()), total_ms / r.step_ms.size(),
                               profile_ceiling[precision][i], memory_roof,
                               gemm_seconds_alone(profile, config.threads, args.gemm_repeats));
        }
        std::fflush(stdout);  // rows arrive minutes apart: show each as it is measured
        if (i == 0 && precision == args.precisions.front() && library == libraries.front()) {
          fmt::print("#   (N = {} parameters, {:.3g} model FLOPs/token)\n", r.parameters,
                     r.flops_per_token);
        }
      }
    }
  }
  fmt::print("# machine at end: {}\n", machine_state());
}

// ---- calibrate ----

struct CalibrateArgs {
  std::string out = "cluster_profile.json";
  std::string comm_out;  // the tuner's profile; "": `out` with .comm.json for .json
  std::string name = "this-machine";
  int threads = 1;     // per rank (and per GEMM)
  int max_ranks = 0;   // largest collective group; 0: cores ÷ threads (at least 2)
  bool quick = false;  // tiny shapes and sizes (tests): seconds, not a minute
};

double physical_memory_bytes() {
  return double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
}

std::vector<plan::GemmMeasurement> measure_gemms(const CalibrateArgs& args) {
  // A grid over m, n, k (the planner picks the nearest in log distance) plus GPT-2-small's
  // per-layer shapes at 4096 tokens.
  const std::vector<int64_t> dims =
      args.quick ? std::vector<int64_t>{32, 64} : std::vector<int64_t>{128, 512, 2048};
  std::vector<GemmShape> shapes;
  for (int64_t m : dims) {
    for (int64_t k : dims) {
      for (int64_t n : dims) shapes.push_back({m, k, n});
    }
  }
  if (!args.quick) {
    for (auto [k, n] :
         {std::pair<int64_t, int64_t>{768, 2304}, {768, 768}, {768, 3072}, {3072, 768}}) {
      shapes.push_back({4096, k, n});
    }
  }
  std::vector<plan::GemmMeasurement> out;
  for (plan::Precision p : {plan::Precision::kBf16, plan::Precision::kFp32}) {
    const DType dtype = p == plan::Precision::kBf16 ? DType::kBF16 : DType::kF32;
    for (const GemmShape& s : shapes) {
      const double flops = measure_gemm_flops(s, dtype, args.threads, args.quick ? 2 : 3);
      out.push_back({.precision = p, .m = s.m, .n = s.n, .k = s.k, .flops_per_s = flops});
      fmt::print("#   gemm {:>4} m {:>5} k {:>5} n {:>5}: {:8.1f} GFLOP/s\n",
                 plan::precision_name(p), s.m, s.k, s.n, flops / 1e9);
    }
  }
  return out;
}

void call_collective(Communicator& comm, plan::CollectiveOp op, std::vector<float>& in,
                     std::vector<float>& out, Algorithm algorithm = Algorithm::kAuto) {
  const int64_t n = comm.size();
  CollectiveOptions options;
  options.algorithm = algorithm;
  switch (op) {
    case plan::CollectiveOp::kAllReduce:
      comm.all_reduce(in.data(), int64_t(in.size()), DType::kF32, ReduceOp::kSum, options);
      break;
    case plan::CollectiveOp::kAllGather:
      comm.all_gather(in.data(), out.data(), int64_t(out.size()) / n, DType::kF32, options);
      break;
    case plan::CollectiveOp::kReduceScatter:
      comm.reduce_scatter(in.data(), out.data(), int64_t(in.size()) / n, DType::kF32,
                          ReduceOp::kSum, options);
      break;
    case plan::CollectiveOp::kAllToAll: {  // equal blocks, as balanced routing sends
      const std::vector<int64_t> counts(size_t(n), int64_t(in.size()) / n);
      comm.all_to_all(in.data(), counts, out.data(), counts, DType::kF32);
      break;
    }
    case plan::CollectiveOp::kSendRecv:
      LATTICE_CHECK(false, "send/recv is not calibrated");
  }
}

// Seconds per call (the tuner's algorithm), max over ranks; S = the whole buffer (nccl-tests).
// The fastest of three timed loops: on a shared machine the slower ones measure the neighbours.
double time_collective(Communicator& comm, plan::CollectiveOp op, int64_t bytes, double budget,
                       Algorithm algorithm = Algorithm::kAuto) {
  const int64_t count = bytes / 4 / comm.size() * comm.size();
  std::vector<float> in(size_t(count), 1.0f), out(size_t(count), 0.0f);
  call_collective(comm, op, in, out, algorithm);  // warm-up
  comm.barrier();
  Stopwatch once;
  call_collective(comm, op, in, out, algorithm);
  float first = float(once.seconds());
  comm.all_reduce(&first, 1, DType::kF32, ReduceOp::kMax);
  const int iters = int(std::clamp(budget / std::max(double(first), 1e-7), 1.0, 200.0));
  float fastest = 0.0f;
  for (int loop = 0; loop < 3; ++loop) {
    comm.barrier();
    Stopwatch watch;
    for (int i = 0; i < iters; ++i) call_collective(comm, op, in, out, algorithm);
    float seconds = float(watch.seconds() / iters);
    comm.all_reduce(&seconds, 1, DType::kF32, ReduceOp::kMax);
    fastest = loop == 0 ? seconds : std::min(fastest, seconds);
  }
  return fastest;
}

std::vector<plan::CollectiveMeasurement> measure_collectives(const CalibrateArgs& args) {
  const int max_ranks =
      args.max_ranks > 0 ? args.max_ranks : std::max(2, available_cores() / args.threads);
  const int64_t min_bytes = args.quick ? 4 << 10 : 256 << 10;
  // --quick still reaches 1 MiB: below that the times are all latency, and on a busy machine
  // the fit's bandwidth term comes out zero or negative (refused below).
  const int64_t max_bytes = args.quick ? 1 << 20 : 64 << 20;
  const double budget = args.quick ? 0.005 : 0.05;
  std::vector<plan::CollectiveMeasurement> out;
  for (int n = 2; n <= max_ranks; ++n) {
    for (plan::CollectiveOp op :
         {plan::CollectiveOp::kAllReduce, plan::CollectiveOp::kAllGather,
          plan::CollectiveOp::kReduceScatter, plan::CollectiveOp::kAllToAll}) {
      // A burst of load elsewhere can flatten the curve into a fit without a bandwidth term:
      // measured again, up to three times, before it is refused.
      CostModel fit;
      for (int attempt = 0; attempt < 3 && fit.beta <= 0; ++attempt) {
        std::vector<std::pair<double, double>> points;  // (bytes, seconds)
        ThreadWorldOptions world;
        world.config.algorithms = AlgorithmChoice::kModel;  // the model's choice, never re-tuned
        run_ranks(
            n,
            [&](Communicator& comm) {
              set_thread_budget(args.threads);
              for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
                const double seconds = time_collective(comm, op, bytes, budget);
                if (comm.rank() == 0) points.emplace_back(double(bytes), seconds);
              }
            },
            world);
        fit = fit_cost_model(points);
      }
      if (fit.beta <= 0) {
        LATTICE_THROW(ValueError,
                      "calibrate: {} on {} ranks fitted no bandwidth term (beta 0) in three "
                      "measurements ---> HINT: "
                      "rerun on a quieter machine, or without --quick",
                      plan::collective_name(op), n);
      }
      const double bus = plan::bus_factor(op, n) / fit.beta;
      out.push_back({.op = op, .group_size = n, .alpha_s = fit.alpha, .bus_bytes_per_s = bus});
      fmt::print("#   {:<14} {} ranks: alpha {:8.2f} us, bus bandwidth {:7.3f} GB/s\n",
                 plan::collective_name(op), n, fit.alpha * 1e6, bus / 1e9);
    }
  }
  return out;
}

// The tuner's profile (comm/cost_model.h): every candidate algorithm of the collectives a
// training step tunes, timed at each size and fitted to α + β·bytes, for group sizes 2, 4, 8, …
// up to the largest (a group size the profile lacks is priced by the analytic model).
CostProfile measure_comm_profile(const CalibrateArgs& args) {
  const int max_ranks =
      args.max_ranks > 0 ? args.max_ranks : std::max(2, available_cores() / args.threads);
  const int64_t min_bytes = args.quick ? 4 << 10 : 256 << 10;
  const int64_t max_bytes = args.quick ? 1 << 20 : 64 << 20;
  const double budget = args.quick ? 0.005 : 0.05;
  std::vector<int> sizes;
  for (int n = 2; n <= max_ranks; n *= 2) sizes.push_back(n);
  if (sizes.back() != max_ranks) sizes.push_back(max_ranks);
  const std::pair<plan::CollectiveOp, Collective> ops[] = {
      {plan::CollectiveOp::kAllReduce, Collective::kAllReduce},
      {plan::CollectiveOp::kAllGather, Collective::kAllGather},
      {plan::CollectiveOp::kReduceScatter, Collective::kReduceScatter}};
  CostProfile profile;
  for (const int n : sizes) {
    std::map<std::pair<Collective, Algorithm>, std::vector<std::pair<double, double>>> points;
    ThreadWorldOptions world;
    world.config.algorithms = AlgorithmChoice::kModel;
    run_ranks(
        n,
        [&](Communicator& comm) {
          set_thread_budget(args.threads);
          for (const auto& [op, collective] : ops) {
            for (const Algorithm a : comm.tuner().candidates(collective)) {
              for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
                const double seconds = time_collective(comm, op, bytes, budget, a);
                if (comm.rank() == 0) points[{collective, a}].emplace_back(double(bytes), seconds);
              }
            }
          }
        },
        world);
    for (const auto& [key, measured] : points) {
      CostModel model = fit_cost_model(measured);
      if (!(model.beta > 0)) {
        // A burst of load flattened the curve: a negative slope would price large messages as
        // free, so the algorithm keeps its fastest measured time at every size instead.
        model.beta = 0;
        model.alpha = measured.front().second;
        for (const auto& [bytes, seconds] : measured) model.alpha = std::min(model.alpha, seconds);
      }
      profile.set(key.first, key.second, n, model);
      fmt::print("#   tuner {:<14} {:<4} {} ranks: alpha {:8.2f} us, 1/beta {:7.3f} GB/s\n",
                 collective_name(key.first), algorithm_name(key.second), n, model.alpha * 1e6,
                 model.beta > 0 ? 1e-9 / model.beta : 0.0);
    }
  }
  return profile;
}

// --comm-out, or the cluster profile's name with .comm.json.
std::string comm_profile_path(const CalibrateArgs& args) {
  if (!args.comm_out.empty()) return args.comm_out;
  std::filesystem::path path(args.out);
  path.replace_extension(".comm.json");
  return path.string();
}

void run_calibrate(const CalibrateArgs& args) {
  plan::MachineMeasurement m;
  m.name = args.name;
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  m.device_name = fmt::format("cpu {} ({} thread(s) per rank)", host, args.threads);
  m.ranks_per_node = std::max(1, available_cores() / args.threads);
  m.memory_bytes = physical_memory_bytes();
  m.memory_bytes_per_s =
      memcpy_traffic_bytes_per_s(args.quick ? size_t(1) << 20 : size_t(64) << 20);
  fmt::print("# lattice bench calibrate: {} thread(s) per rank, {} ranks per node\n", args.threads,
             m.ranks_per_node);
  fmt::print("# memory {:.1f} GiB, memcpy traffic {:.2f} GB/s\n", m.memory_bytes / (1 << 30),
             m.memory_bytes_per_s / 1e9);
  m.gemm = measure_gemms(args);
  m.collectives = measure_collectives(args);
  const plan::ClusterSpec cluster = plan::calibrated_cluster(m);
  plan::save_cluster_profile(cluster, args.out);
  fmt::print("# peaks (best GEMM measured): bf16 {:.1f} GFLOP/s, fp32 {:.1f} GFLOP/s\n",
             cluster.device.peak_flops_bf16 / 1e9, cluster.device.peak_flops_fp32 / 1e9);
  fmt::print("# wrote {} (use: lattice plan --cluster {})\n", args.out, args.out);
  const std::string comm_out = comm_profile_path(args);
  measure_comm_profile(args).save(comm_out, TransportKind::kThreads);
  fmt::print("# wrote {} (use: lattice train CONFIG --set parallel.comm_profile={})\n", comm_out,
             comm_out);
}

}  // namespace

void register_bench_command(CLI::App& app) {
  CLI::App* bench = bench_parent(app);

  auto train = std::make_shared<BenchTrainArgs>();
  CLI::App* t = bench->add_subcommand(
      "train", "Training steps per precision x threads: tok/s, ms/step, model FLOP/s vs GEMM");
  t->add_option("--preset", train->preset, "model preset (random init)");
  t->add_option("--batch", train->batch, "sequences per step")->check(positive_number());
  t->add_option("--seq", train->seq, "tokens per sequence")->check(positive_number());
  t->add_option("--steps", train->steps, "timed steps")->check(positive_number());
  t->add_option("--warmup", train->warmup, "untimed steps first")->check(non_negative_number());
  t->add_option("--threads", train->threads, "thread counts, e.g. 1,2 (default 1 and all cores)")
      ->delimiter(',')
      ->check(positive_number());
  t->add_option("--precision", train->precisions, "fp32 and/or bf16, e.g. fp32,bf16")
      ->delimiter(',')
      ->check(CLI::IsMember({"fp32", "bf16"}));
  t->add_option("--ceiling-shape", train->ceiling_shape, "M,K,N of the bf16 GEMM ceiling")
      ->delimiter(',');
  t->add_option("--gemm-repeats", train->gemm_repeats, "timed GEMM calls (best is kept)")
      ->check(positive_number());
  t->add_flag("--profile", train->profile,
              "split each row's step into its kernels: time, share, rate against the roof");
  t->add_option("--gemm-library", train->gemm_libraries,
                "matmul's library for the rows, e.g. onednn,mkl (default onednn); --profile "
                "times each GEMM alone in every library either way")
      ->delimiter(',')
      ->check(CLI::IsMember({"onednn", "mkl"}));
  t->callback([train] { run_bench_train(*train); });

  auto cal = std::make_shared<CalibrateArgs>();
  CLI::App* c = bench->add_subcommand(
      "calibrate", "Measure this machine and write a cluster profile for `lattice plan`");
  c->add_option("--out", cal->out, "profile JSON to write");
  c->add_option("--comm-out", cal->comm_out,
                "the tuner's alpha-beta profile to write (default: --out with .comm.json), for "
                "parallel.comm_profile");
  c->add_option("--name", cal->name, "the profile's name");
  c->add_option("--threads", cal->threads, "threads per rank")->check(positive_number());
  c->add_option("--max-ranks", cal->max_ranks, "largest collective group (default cores/threads)")
      ->check(non_negative_number());
  c->add_flag("--quick", cal->quick, "tiny shapes and sizes (a smoke test, not a calibration)");
  c->callback([cal] { run_calibrate(*cal); });
}

}  // namespace lattice::cli
