// The planner's search over every layout of a 1024-GPU cluster (issue 9 asks for an answer in
// under a second), against a baseline measured in the same run: judging one layout on its own
// (evaluate(): divisibility, memory, time). The search's cost per judged layout is reported
// beside it, so the ratio says whether the search does more than judge each layout once
// (structurally rejected layouts are cheaper than the baseline, so the ratio is below 1).
//
//   build-*/bench/plan_search_bench
#include <benchmark/benchmark.h>

#include "plan/model_presets.h"
#include "plan/search.h"

namespace lattice::plan {
namespace {

TrainingSetup setup_for(const char* model, const char* cluster, int64_t global_batch,
                        int64_t seq_len) {
  TrainingSetup s;
  s.model = model_preset(model);
  s.cluster = cluster_preset(cluster);
  s.devices = 1024;
  s.global_batch = global_batch;
  s.seq_len = seq_len;
  return s;
}

// Baseline: one feasible Llama-3-70B layout, judged alone.
void BM_EvaluateOneLayout(benchmark::State& state) {
  const TrainingSetup s = setup_for("llama-3-70b", "dgx-h100", 1024, 4096);
  const Layout layout{.dp = 16,
                      .tp = 8,
                      .pp = 8,
                      .virtual_stages = 5,
                      .zero = 1,
                      .micro_batch = 1,
                      .sequence_parallel = true,
                      .schedule = Schedule::kInterleaved1F1B};
  for (auto _ : state) benchmark::DoNotOptimize(evaluate(s, layout));
}
BENCHMARK(BM_EvaluateOneLayout);

void search(benchmark::State& state, const TrainingSetup& s) {
  int64_t evaluated = 0;
  for (auto _ : state) {
    SearchResult r = search_layouts(s, {});
    evaluated = r.evaluated;
    benchmark::DoNotOptimize(r);
  }
  state.counters["layouts"] = double(evaluated);
  // Seconds per judged layout, comparable with BM_EvaluateOneLayout's time.
  state.counters["per_layout"] =
      benchmark::Counter(double(evaluated) * double(state.iterations()),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

void BM_SearchLlama70bOn1024H100(benchmark::State& state) {
  search(state, setup_for("llama-3-70b", "dgx-h100", 1024, 4096));
}
BENCHMARK(BM_SearchLlama70bOn1024H100)->Unit(benchmark::kMillisecond);

void BM_SearchGpt3On1024A100(benchmark::State& state) {
  search(state, setup_for("gpt3-175b", "dgx-a100", 1536, 2048));
}
BENCHMARK(BM_SearchGpt3On1024A100)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace lattice::plan

BENCHMARK_MAIN();
