// `lattice bench comm`: an nccl-tests style table (size, count, algorithm, time, algbw, busbw,
// #wrong) for each collective and algorithm from 4 KiB to 256 MiB, every result verified, on
// either transport:
//   lattice bench comm --ranks 2                          (threads)
//   mpirun -np 4 lattice bench comm --transport mpi
//   lattice bench comm --calibrate comm_profile.json     (fits and writes alpha, beta)
// Then it rebuilds the tuner from the fitted models and reports, per size, the algorithm kAuto
// picks and how much slower it is than the best one measured. A single-thread memcpy of 64 MiB
// is measured first as the same-run baseline.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cli/bench_parent.h"
#include "cli/bench_util.h"
#include "cli/commands.h"
#include "comm/communicator.h"
#include "comm/mpi_transport.h"
#include "comm/thread_world.h"
#include "core/error.h"
#include "core/timer.h"

namespace lattice::cli {
namespace {

struct BenchCommArgs {
  std::string transport = "threads";
  int ranks = 2;
  std::string calibrate;  // file to write the fitted profile to
  std::string profile;    // measured profile to price kAuto with instead of fitting one
  std::vector<std::string> collectives{"all_reduce", "reduce_scatter", "all_gather",
                                       "broadcast",  "reduce",         "all_to_all"};
  int64_t min_bytes = int64_t(4) << 10;
  int64_t max_bytes = int64_t(256) << 20;
  double seconds_per_size = 0.05;  // timed iterations per size target about this long
};

Collective parse_collective(const std::string& name) {
  for (int c = 0; c < kCollectiveCount; ++c) {
    if (collective_name(Collective(c)) == name) return Collective(c);
  }
  LATTICE_THROW(ValueError,
                "unknown collective '{}' ---> HINT: all_reduce, reduce_scatter, all_gather, "
                "broadcast, reduce or all_to_all",
                name);
}

// Verifiable f32 data: small integers unique per rank and index; sums stay exact.
float contribution(int rank, int64_t index) {
  return float(int((index * 7 + rank * 13 + index / 5) % 33) - 16);
}

struct Buffers {
  std::vector<float> input, output;
  int64_t in_count = 0, out_count = 0;
  std::vector<int64_t> per_rank;  // all_to_all: the block each peer gets (count / n each)
};

// Sizes as nccl-tests counts them: the full vector (comm_stats.h).
Buffers make_buffers(Collective c, int64_t count, int n) {
  Buffers b;
  b.in_count = c == Collective::kAllGather ? count / n : count;
  b.out_count = c == Collective::kReduceScatter ? count / n : count;
  b.input.resize(size_t(b.in_count));
  b.output.resize(size_t(b.out_count));
  if (c == Collective::kAllToAll) b.per_rank.assign(size_t(n), count / n);
  return b;
}

void call(Communicator& comm, Collective c, Buffers& b, Algorithm a) {
  CollectiveOptions o;
  o.algorithm = a;
  o.timeout = std::chrono::milliseconds(60000);
  switch (c) {
    case Collective::kAllReduce:
      comm.all_reduce(b.input.data(), b.in_count, DType::kF32, ReduceOp::kSum, o);
      break;
    case Collective::kReduceScatter:
      comm.reduce_scatter(b.input.data(), b.output.data(), b.out_count, DType::kF32, ReduceOp::kSum,
                          o);
      break;
    case Collective::kAllGather:
      comm.all_gather(b.input.data(), b.output.data(), b.in_count, DType::kF32, o);
      break;
    case Collective::kBroadcast:
      comm.broadcast(b.input.data(), b.in_count, DType::kF32, 0, o);
      break;
    case Collective::kReduce:
      comm.reduce(b.input.data(), b.output.data(), b.in_count, DType::kF32, 0, ReduceOp::kSum, o);
      break;
    case Collective::kAllToAll:
      comm.all_to_all(b.input.data(), b.per_rank, b.output.data(), b.per_rank, DType::kF32, o);
      break;
    default:
      LATTICE_CHECK(false);
  }
}

// One verified call: returns the number of wrong elements on this rank.
int64_t verify(Communicator& comm, Collective c, Buffers& b, Algorithm a) {
  const int n = comm.size(), r = comm.rank();
  const int64_t offset = c == Collective::kAllGather ? b.in_count * r : 0;
  for (int64_t i = 0; i < b.in_count; ++i) b.input[size_t(i)] = contribution(r, offset + i);
  std::fill(b.output.begin(), b.output.end(), -999.0f);
  call(comm, c, b, a);
  auto sum = [&](int64_t i) {
    float s = 0;
    for (int q = 0; q < n; ++q) s += contribution(q, i);
    return s;
  };
  int64_t wrong = 0;
  switch (c) {
    case Collective::kAllReduce:
      for (int64_t i = 0; i < b.in_count; ++i) wrong += b.input[size_t(i)] != sum(i);
      break;
    case Collective::kReduceScatter:
      for (int64_t i = 0; i < b.out_count; ++i) {
        wrong += b.output[size_t(i)] != sum(b.out_count * r + i);
      }
      break;
    case Collective::kAllGather:
      for (int64_t i = 0; i < b.out_count; ++i) {
        wrong += b.output[size_t(i)] != contribution(int(i / b.in_count), i);
      }
      break;
    case Collective::kBroadcast:
      for (int64_t i = 0; i < b.in_count; ++i) wrong += b.input[size_t(i)] != contribution(0, i);
      break;
    case Collective::kReduce:
      if (r == 0) {
        for (int64_t i = 0; i < b.out_count; ++i) wrong += b.output[size_t(i)] != sum(i);
      }
      break;
    case Collective::kAllToAll: {
      // Block q of the output is rank q's block r.
      const int64_t block = b.out_count / n;
      for (int64_t i = 0; i < b.out_count; ++i) {
        wrong += b.output[size_t(i)] != contribution(int(i / block), r * block + i % block);
      }
      break;
    }
    default:
      break;
  }
  return wrong;
}

float max_over_ranks(Communicator& comm, float v) {
  CollectiveOptions o;
  o.algorithm = Algorithm::kTree;
  comm.all_reduce(&v, 1, DType::kF32, ReduceOp::kMax, o);
  return v;
}

// Seconds per call: the best of three batches' mean, each the max over ranks (every rank waits
// for the slowest). The best batch discards time slices lost to other processes on a shared
// machine; the mean within a batch keeps pipelining between consecutive calls, as nccl-tests.
double time_calls(Communicator& comm, Collective c, Buffers& b, Algorithm a, double budget) {
  constexpr int kBatches = 3;
  call(comm, c, b, a);  // warm-up
  comm.barrier();
  Stopwatch once;
  call(comm, c, b, a);
  const double first = max_over_ranks(comm, float(once.seconds()));
  const int iters = int(std::clamp(budget / kBatches / std::max(first, 1e-7), 1.0, 100.0));
  double best = 1e30;
  for (int batch = 0; batch < kBatches; ++batch) {
    comm.barrier();
    Stopwatch watch;
    for (int i = 0; i < iters; ++i) call(comm, c, b, a);
    best = std::min(best, double(max_over_ranks(comm, float(watch.seconds() / iters))));
  }
  return best;
}

double memcpy_bandwidth() {
  const size_t bytes = size_t(64) << 20;
  return double(bytes) / memcpy_seconds(bytes);
}

std::string human_bytes(int64_t bytes) {
  if (bytes >= (int64_t(1) << 20)) return fmt::format("{}M", bytes >> 20);
  if (bytes >= 1024) return fmt::format("{}K", bytes >> 10);
  return fmt::format("{}", bytes);
}

void run_bench(Communicator& comm, const BenchCommArgs& args) {
  const int n = comm.size();
  const bool lead = comm.rank() == 0;
  auto say = [&](const std::string& line) {
    if (lead) fmt::print("{}\n", line);
  };
  const double memcpy_bw = lead ? memcpy_bandwidth() : 0;
  say(fmt::format("# lattice bench comm: transport {}, {} ranks",
                  transport_name(comm.transport_kind()), n));
  say(fmt::format("# baseline: single-thread memcpy of 64 MiB: {:.2f} GB/s", memcpy_bw / 1e9));
  // (collective, bytes, algorithm) -> seconds, for the fit and for judging kAuto.
  std::map<std::tuple<Collective, int64_t, Algorithm>, double> measured;
  int64_t total_wrong = 0;
  for (const std::string& name : args.collectives) {
    const Collective c = parse_collective(name);
    const std::vector<Algorithm>& algorithms = comm.tuner().candidates(c);
    const double factor = bus_bandwidth_factor(c, n);
    say(fmt::format("#\n# {}  (busbw = algbw x {:.3f})", name, factor));
    say(fmt::format("# {:>10} {:>10} {:>6} {:>7} {:>11} {:>11} {:>11} {:>7}", "size", "count",
                    "type", "algo", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong"));
    for (int64_t bytes = args.min_bytes; bytes <= args.max_bytes; bytes *= 4) {
      const int64_t count = bytes / 4 / n * n;
      Buffers buffers = make_buffers(c, count, n);
      for (Algorithm a : algorithms) {
        float wrong = float(verify(comm, c, buffers, a));
        CollectiveOptions o;
        o.algorithm = Algorithm::kTree;
        comm.all_reduce(&wrong, 1, DType::kF32, ReduceOp::kSum, o);
        total_wrong += int64_t(wrong);
        const double seconds = time_calls(comm, c, buffers, a, args.seconds_per_size);
        measured[{c, bytes, a}] = seconds;
        const double algbw = double(count * 4) / seconds;
        say(fmt::format("  {:>10} {:>10} {:>6} {:>7} {:>11.1f} {:>11.3f} {:>11.3f} {:>7}",
                        count * 4, count, "float", algorithm_name(a), seconds * 1e6, algbw / 1e9,
                        algbw * factor / 1e9, int64_t(wrong)));
      }
    }
  }

  // Fit alpha, beta per (collective, algorithm) from this run (identical on every rank: the
  // times are maxima over ranks), or take the given profile.
  CostProfile profile;
  if (!args.profile.empty()) {
    profile = CostProfile::load(args.profile);
  } else {
    std::map<std::pair<Collective, Algorithm>, std::vector<std::pair<double, double>>> points;
    for (const auto& [key, seconds] : measured) {
      const auto& [c, bytes, a] = key;
      points[{c, a}].emplace_back(double(bytes), seconds);
    }
    say("#\n# alpha-beta fit: time = alpha + beta * bytes");
    for (const auto& [key, pts] : points) {
      CostModel m = fit_cost_model(pts);
      profile.set(key.first, key.second, n, m);
      say(fmt::format("#   {:<15} {:<7} alpha {:>9.2f} us   1/beta {:>8.3f} GB/s",
                      collective_name(key.first), algorithm_name(key.second), m.alpha * 1e6,
                      m.beta > 0 ? 1e-9 / m.beta : 0.0));
    }
    if (!args.calibrate.empty() && lead) {
      profile.save(args.calibrate, comm.transport_kind());
      say(fmt::format("# wrote {}", args.calibrate));
    }
  }

  // The tuner's choice against the best algorithm, judged at held-out sizes halfway (in log
  // scale) between the measured ones: every algorithm is measured afresh there.
  comm.set_profile(profile);
  say("#\n# tuner (auto) vs best, measured at sizes the profile has not seen");
  say(fmt::format("# {:<15} {:>6} {:>8} {:>8} {:>11} {:>11} {:>8}", "collective", "size", "auto ->",
                  "best", "auto(us)", "best(us)", "slower"));
  double worst = 1;
  for (const std::string& name : args.collectives) {
    const Collective c = parse_collective(name);
    const std::vector<Algorithm>& algorithms = comm.tuner().candidates(c);
    if (algorithms.size() == 1) continue;  // nothing to choose between
    for (int64_t bytes = args.min_bytes * 2; bytes < args.max_bytes; bytes *= 4) {
      const int64_t count = bytes / 4 / n * n;
      Buffers buffers = make_buffers(c, count, n);
      std::map<Algorithm, double> held_out;
      Algorithm best = algorithms.front();
      for (Algorithm a : algorithms) {
        float wrong = float(verify(comm, c, buffers, a));
        CollectiveOptions o;
        o.algorithm = Algorithm::kTree;
        comm.all_reduce(&wrong, 1, DType::kF32, ReduceOp::kSum, o);
        total_wrong += int64_t(wrong);
        held_out[a] = time_calls(comm, c, buffers, a, args.seconds_per_size);
        if (held_out[a] < held_out[best]) best = a;
      }
      const Algorithm chosen = comm.planned_algorithm(c, size_t(count * 4));
      const double ratio = held_out[chosen] / held_out[best];
      worst = std::max(worst, ratio);
      say(fmt::format("  {:<15} {:>6} {:>8} {:>8} {:>11.1f} {:>11.1f} {:>7.1f}%", name,
                      human_bytes(bytes), algorithm_name(chosen), algorithm_name(best),
                      held_out[chosen] * 1e6, held_out[best] * 1e6, (ratio - 1) * 100));
    }
  }
  say(fmt::format("# worst tuner choice: {:.1f}% slower than the best measured",
                  (worst - 1) * 100));
  const std::vector<Algorithm>& algorithms = comm.tuner().candidates(Collective::kAllReduce);
  auto allreduce_64m =
      measured.find({Collective::kAllReduce, int64_t(64) << 20, algorithms.front()});
  if (allreduce_64m != measured.end() && lead) {
    double best_bw = 0;
    for (Algorithm a : algorithms) {
      auto it = measured.find({Collective::kAllReduce, int64_t(64) << 20, a});
      if (it != measured.end()) {
        best_bw = std::max(best_bw, double(64 << 20) / it->second *
                                        bus_bandwidth_factor(Collective::kAllReduce, n));
      }
    }
    say(fmt::format("# all_reduce 64 MiB best busbw {:.2f} GB/s = {:.0f}% of memcpy", best_bw / 1e9,
                    100 * best_bw / memcpy_bw));
  }
  say(fmt::format("# out of bounds values: {} {}", total_wrong,
                  total_wrong == 0 ? "OK" : "FAILED"));
  if (total_wrong != 0) LATTICE_THROW(CommError, "bench comm: {} wrong elements", total_wrong);
}

}  // namespace

void register_bench_comm_command(CLI::App& app) {
  CLI::App* bench = bench_parent(app);
  auto args = std::make_shared<BenchCommArgs>();
  CLI::App* cmd = bench->add_subcommand(
      "comm", "Collectives x algorithms, 4 KiB to 256 MiB, verified (nccl-tests style)");
  cmd->add_option("--transport", args->transport, "threads or mpi (run under mpirun)")
      ->check(CLI::IsMember({"threads", "mpi"}));
  cmd->add_option("--ranks", args->ranks, "threads transport: number of in-process ranks")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--calibrate", args->calibrate, "write the fitted alpha-beta profile (JSON)");
  cmd->add_option("--profile", args->profile, "judge the tuner with this profile instead of a fit");
  cmd->add_option("--collectives", args->collectives, "subset of collectives to run");
  cmd->add_option("--min-bytes", args->min_bytes, "smallest size (default 4096)");
  cmd->add_option("--max-bytes", args->max_bytes, "largest size (default 256 MiB)");
  cmd->add_option("--seconds-per-size", args->seconds_per_size, "timed time per measurement");
  cmd->callback([args] {
    CommConfig config;
    config.algorithms = AlgorithmChoice::kModel;  // the bench measures each algorithm as it is
    if (args->transport == "mpi") {
      Communicator world(MpiTransport::create(), config);
      run_bench(world, *args);
    } else {
      ThreadWorldOptions world;
      world.config = config;
      run_ranks(
          args->ranks, [&](Communicator& comm) { run_bench(comm, *args); }, world);
    }
  });
}

}  // namespace lattice::cli
