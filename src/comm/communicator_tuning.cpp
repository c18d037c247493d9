// Adaptive tuning: when kAuto calls of one size bucket run persistently slower than the model
// predicts (a congested or slow link), re-measure every candidate algorithm at that size and
// switch to the fastest. Ranks agree on every number with all-reduces (max) first, so all of
// them switch at the same call to the same algorithm.
#include <spdlog/spdlog.h>

#include <vector>

#include "comm/communicator.h"
#include "core/timer.h"

namespace lattice {
namespace {

// Calls timed per algorithm when re-measuring; the max over ranks of their mean is kept.
constexpr int kRemeasureCalls = 2;

}  // namespace

void Communicator::retune_if_slow(Collective collective, size_t bytes) {
  CollectiveOptions agree;
  agree.algorithm = Algorithm::kTree;
  float slowdown = float(tuner_.take_window_slowdown(collective, bytes));
  all_reduce(&slowdown, 1, DType::kF32, ReduceOp::kMax, agree);
  if (slowdown <= Tuner::kSlowdownThreshold) return;

  TuningEvent event;
  event.collective = collective;
  event.bytes = bytes;
  event.slowdown = slowdown;
  event.before = tuner_.choose(collective, bytes);
  for (Algorithm a : tuner_.candidates(collective)) {
    float seconds = float(time_collective(collective, a, bytes));
    all_reduce(&seconds, 1, DType::kF32, ReduceOp::kMax, agree);
    tuner_.rescale(collective, a, bytes, seconds);
    event.measured_seconds.emplace_back(a, seconds);
  }
  event.after = tuner_.choose(collective, bytes);
  if (rank_ == 0) {
    std::string measured;
    for (auto [a, s] : event.measured_seconds) {
      measured += fmt::format(" {}={:.3f}ms", algorithm_name(a), s * 1e3);
    }
    spdlog::info(
        "comm tuner: {} of {} bytes on group '{}' ran {:.2f}x slower than predicted over {} "
        "calls; re-measured:{}; {} -> {}",
        collective_name(collective), bytes, name_, slowdown, Tuner::kWindow, measured,
        algorithm_name(event.before), algorithm_name(event.after));
  }
  tuning_events_.push_back(std::move(event));
}

double Communicator::time_collective(Collective collective, Algorithm algorithm, size_t bytes) {
  const int n = size();
  const int64_t count = std::max<int64_t>(int64_t(bytes / sizeof(float)) / n * n, n);
  std::vector<float> a(size_t(count), 1.0f), b(size_t(count), 0.0f);
  CollectiveOptions options;
  options.algorithm = algorithm;
  Stopwatch watch;
  for (int i = 0; i < kRemeasureCalls; ++i) {
    switch (collective) {
      case Collective::kAllReduce:
        all_reduce(a.data(), count, DType::kF32, ReduceOp::kSum, options);
        break;
      case Collective::kReduceScatter:
        reduce_scatter(a.data(), b.data(), count / n, DType::kF32, ReduceOp::kSum, options);
        break;
      case Collective::kAllGather:
        all_gather(a.data(), b.data(), count / n, DType::kF32, options);
        break;
      case Collective::kBroadcast:
        broadcast(a.data(), count, DType::kF32, 0, options);
        break;
      case Collective::kReduce:
        reduce(a.data(), b.data(), count, DType::kF32, 0, ReduceOp::kSum, options);
        break;
      default:
        barrier(options);
        break;
    }
  }
  return watch.seconds() / kRemeasureCalls;
}

}  // namespace lattice
