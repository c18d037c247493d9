// `lattice bench pipeline --stages 4 --micro-batches 4,8,16 --forward-ms 4`: the measured
// bubble of each pipeline schedule the runtime executes, against the theory.
//
// The stages are synthetic: a forward sleeps forward-ms / v, a backward twice that (per chunk),
// while the runtime (parallel/pipeline_runtime.h) runs the real schedule and moves a real
// activation tensor between the in-process ranks. Sleeping instead of computing measures the
// schedule and the runtime (ordering, transfers, waits) without the ranks competing for this
// machine's cores, which a p = 4 pipeline of real compute on 2 cores would. The bubble of a rank
// is its time not computing: measured as (step − compute) / compute, the theory's form
// ((p − 1)/m for gpipe and 1f1b, (p − 1)/(v·m) interleaved, (p − 1)/(3m) zb-h1 with the
// backward split into equal input and weight halves), and as a share of the step.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "cli/bench_parent.h"
#include "cli/commands.h"
#include "cli/validators.h"
#include "comm/thread_world.h"
#include "core/timer.h"
#include "parallel/pipeline_runtime.h"

namespace lattice::cli {
namespace {

struct BenchPipelineArgs {
  int stages = 4;
  std::vector<int> micro_batches{4, 8, 16};
  double forward_ms = 4.0;
  int steps = 3;
  int64_t activation_elements = 1 << 16;
};

// Compute replaced by sleeps; the activations are real tensors the runtime sends and receives.
class SleepingStage : public PipelineStage {
 public:
  SleepingStage(Arena& arena, int micro_batches, int chunks, int64_t elements,
                std::chrono::microseconds forward)
      : forward_(forward) {
    for (int i = 0; i < micro_batches * chunks; ++i) {
      buffers_.push_back(Tensor::zeros(arena, {elements}, DType::kF32));
    }
    chunks_ = chunks;
  }
  void forward(int, int) override { std::this_thread::sleep_for(forward_); }
  void backward(int, int) override { std::this_thread::sleep_for(2 * forward_); }
  void backward_input(int, int) override { std::this_thread::sleep_for(forward_); }
  void backward_weight(int, int) override { std::this_thread::sleep_for(forward_); }
  const Tensor& output(int mb, int chunk) override { return at(mb, chunk); }
  Tensor& input(int mb, int chunk) override { return at(mb, chunk); }
  const Tensor& input_grad(int mb, int chunk) override { return at(mb, chunk); }
  Tensor& output_grad(int mb, int chunk) override { return at(mb, chunk); }

 private:
  Tensor& at(int mb, int chunk) { return buffers_[size_t(mb * chunks_ + chunk)]; }
  std::chrono::microseconds forward_;
  std::vector<Tensor> buffers_;
  int chunks_ = 1;
};

struct Measured {
  double idle_per_compute = 0.0;  // mean over ranks, median step
  double idle_share = 0.0;
};

Measured measure(const BenchPipelineArgs& args, ScheduleKind kind, int m, int v) {
  const Schedule schedule = make_schedule(kind, args.stages, m, v);
  std::vector<std::vector<PipelineStepStats>> per_rank(static_cast<size_t>(args.stages));
  const auto forward = std::chrono::microseconds(int64_t(args.forward_ms * 1e3 / v));
  ThreadWorldOptions world;
  world.config.algorithms = AlgorithmChoice::kModel;  // waits in barriers are the point
  run_ranks(
      args.stages,
      [&](Communicator& comm) {
        Arena arena(fmt::format("stage{}", comm.rank()));
        SleepingStage stage(arena, m, v, args.activation_elements, forward);
        PipelineRuntime runtime(comm, arena);
        for (int s = 0; s < args.steps + 1; ++s) {
          // The step is the pipeline's makespan: from a common start to the last stage's finish, so
          // that a stage done early counts its wait for the others (as the theory does).
          comm.barrier();
          Stopwatch step;
          PipelineStepStats stats = runtime.run(schedule.per_rank[size_t(comm.rank())], stage);
          comm.barrier();
          stats.step_seconds = step.seconds();
          if (s > 0) per_rank[size_t(comm.rank())].push_back(stats);  // the first step warms up
        }
      },
      world);
  Measured result;
  for (const auto& steps : per_rank) {
    std::vector<double> ratio, share;
    for (const PipelineStepStats& st : steps) {
      ratio.push_back((st.step_seconds - st.compute_seconds) / st.compute_seconds);
      share.push_back(st.bubble_fraction());
    }
    std::sort(ratio.begin(), ratio.end());
    std::sort(share.begin(), share.end());
    result.idle_per_compute += ratio[ratio.size() / 2] / double(per_rank.size());
    result.idle_share += share[share.size() / 2] / double(per_rank.size());
  }
  return result;
}

void run_bench_pipeline(const BenchPipelineArgs& args) {
  const int p = args.stages;
  fmt::print(
      "pipeline bubble, p = {} in-process stages, synthetic stages (forward {} ms, backward 2x, "
      "per chunk / v), activation {} KiB, median of {} steps\n",
      p, args.forward_ms, args.activation_elements * 4 / 1024, args.steps);
  fmt::print("{:<18} {:>4} {:>3} {:>13} {:>8} {:>10} {:>10} {:>11}\n", "schedule", "m", "v",
             "idle/compute", "theory", "diff (pp)", "simulated", "idle share");
  struct Kind {
    ScheduleKind kind;
    int v;
  };
  for (Kind k : {Kind{ScheduleKind::kGpipe, 1}, Kind{ScheduleKind::kOneFOneB, 1},
                 Kind{ScheduleKind::kInterleaved1F1B, 2}, Kind{ScheduleKind::kZeroBubbleH1, 1}}) {
    for (int m : args.micro_batches) {
      if (k.kind == ScheduleKind::kInterleaved1F1B && m % p != 0) continue;
      const Measured got = measure(args, k.kind, m, k.v);
      // The same schedule under the simulator's unit costs (pipeline_schedule.h), which the
      // closed-form theory describes.
      const Schedule schedule = make_schedule(k.kind, p, m, k.v);
      const Timeline timeline = simulate(
          schedule, CostUnits{.forward = 2, .backward_input = 2, .backward_weight = 2, .comm = 0});
      double simulated = 0.0;
      for (int r = 0; r < p; ++r) {
        simulated += double(timeline.idle(r)) / double(timeline.ranks[size_t(r)].busy) / p;
      }
      // Zero-bubble H1 fills two thirds of the 1F1B bubble with deferred weight passes.
      const double theory =
          double(p - 1) / double(k.v * m) / (k.kind == ScheduleKind::kZeroBubbleH1 ? 3.0 : 1.0);
      fmt::print("{:<18} {:>4} {:>3} {:>13.3f} {:>8.3f} {:>+10.1f} {:>10.3f} {:>11.3f}\n",
                 schedule_kind_name(k.kind), m, k.v, got.idle_per_compute, theory,
                 100.0 * (got.idle_per_compute - theory), simulated, got.idle_share);
    }
  }
}

}  // namespace

void register_bench_pipeline_command(CLI::App& app) {
  auto args = std::make_shared<BenchPipelineArgs>();
  CLI::App* cmd = bench_parent(app)->add_subcommand(
      "pipeline", "Measured bubble of each pipeline schedule against the theory");
  cmd->add_option("--stages", args->stages, "Pipeline stages (in-process ranks)")
      ->check(CLI::Range(2, 16));
  cmd->add_option("--micro-batches", args->micro_batches, "Micro-batches per step (list)");
  cmd->add_option("--forward-ms", args->forward_ms, "Forward time of one stage (synthetic)")
      ->check(positive_number());
  cmd->add_option("--steps", args->steps, "Timed steps per configuration")
      ->check(positive_number());
  cmd->callback([args] { run_bench_pipeline(*args); });
}

}  // namespace lattice::cli
