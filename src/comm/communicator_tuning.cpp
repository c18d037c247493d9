// Adaptive tuning: when kAuto calls of one size bucket run persistently slower than the model
// predicts (a congested or slow link), re-measure every candidate algorithm at that size and
// switch to the fastest. Ranks agree on every number with all-reduces (max) first, so all of
// them switch at the same call to the same algorithm: inside the call that closes the window
// (AlgorithmChoice::kRetunedAfterWindow), or at the next step boundary
// (kRetunedAtStepBoundary), where the trainer calls retune_at_step_boundary().
#include <spdlog/spdlog.h>

#include <vector>

#include "comm/communicator.h"
#include "core/timer.h"

namespace lattice {
namespace {

// Calls timed per algorithm when re-measuring; the max over ranks of their mean is kept.
constexpr int kRemeasureCalls = 2;

// The numbers the ranks agree on travel with one fixed algorithm, whatever the tuner thinks.
constexpr CollectiveOptions kAgree{.algorithm = Algorithm::kTree};

}  // namespace

std::string_view algorithm_choice_name(AlgorithmChoice choice) {
  switch (choice) {
    case AlgorithmChoice::kPinned:
      return "pinned";
    case AlgorithmChoice::kModel:
      return "model";
    case AlgorithmChoice::kRetunedAfterWindow:
      return "retuned after a window";
    case AlgorithmChoice::kRetunedAtStepBoundary:
      return "retuned at step boundaries";
  }
  return "?";
}

// Every rank's window, agreed: the max over ranks of the slowdown and of the excess time.
std::vector<Tuner::WindowResult> Communicator::agree_on_windows(
    const std::vector<std::pair<Collective, size_t>>& windows) {
  std::vector<float> numbers;
  for (const auto& [collective, bytes] : windows) {
    const Tuner::WindowResult w = tuner_.take_window(collective, bytes);
    numbers.push_back(float(w.slowdown));
    numbers.push_back(float(w.excess_seconds));
  }
  all_reduce(numbers.data(), int64_t(numbers.size()), DType::kF32, ReduceOp::kMax, kAgree);
  std::vector<Tuner::WindowResult> agreed;
  for (size_t i = 0; i < windows.size(); ++i) {
    agreed.push_back({.slowdown = numbers[2 * i], .excess_seconds = numbers[2 * i + 1]});
  }
  return agreed;
}

void Communicator::retune_if_slow(Collective collective, size_t bytes) {
  const Tuner::WindowResult window = agree_on_windows({{collective, bytes}})[0];
  if (window.slow()) remeasure(collective, bytes, window.slowdown, "");
}

void Communicator::mark_window_closed(Collective collective, size_t bytes) {
  for (const auto& [c, b] : windows_closed_) {
    if (c == collective && Tuner::bucket(b) == Tuner::bucket(bytes)) return;
  }
  windows_closed_.emplace_back(collective, bytes);
}

int Communicator::retune_at_step_boundary(std::string_view when) {
  if (windows_closed_.empty()) return 0;  // then empty on every rank: they made the same calls
  const std::vector<std::pair<Collective, size_t>> closed = std::exchange(windows_closed_, {});
  const std::vector<Tuner::WindowResult> windows = agree_on_windows(closed);
  int remeasured = 0;
  for (size_t i = 0; i < closed.size(); ++i) {
    if (!windows[i].slow()) continue;
    remeasure(closed[i].first, closed[i].second, windows[i].slowdown, when);
    ++remeasured;
  }
  return remeasured;
}

void Communicator::remeasure(Collective collective, size_t bytes, double slowdown,
                             std::string_view when) {
  TuningEvent event;
  event.collective = collective;
  event.bytes = bytes;
  event.slowdown = slowdown;
  event.before = tuner_.choose(collective, bytes);
  const double in_use_seconds = slowdown * tuner_.predict(collective, event.before, bytes);
  const auto measure = [&](Algorithm a) {
    float seconds = float(time_collective(collective, a, bytes));
    all_reduce(&seconds, 1, DType::kF32, ReduceOp::kMax, kAgree);
    return double(seconds);
  };
  for (Algorithm a : tuner_.candidates(collective)) {
    event.measured_seconds.emplace_back(a, measure(a));
  }
  event.after = Tuner::confirmed_choice(event.before, event.measured_seconds, measure,
                                        event.confirmed_seconds);
  // Each candidate's time: its first measurement, or the mean of both for the two measured again.
  Tuner::Timings seconds = event.measured_seconds;
  for (auto& [a, s] : seconds) {
    for (const auto& [again, s2] : event.confirmed_seconds) {
      if (again == a) s = 0.5 * (s + s2);
    }
  }
  for (const auto& [a, s] : seconds) {
    if (a == event.before && s > 0) event.in_use_factor = in_use_seconds / s;
  }
  // The calls of the window ran where they are used (inside a step, beside compute and other
  // groups' traffic), the re-measure alone: every candidate is scaled by the same factor, which
  // leaves the choice to the re-measure and lets the next windows compare like with like
  // (without it every window of a busy step would look slow and re-measure again).
  for (const auto& [a, s] : seconds) tuner_.rescale(collective, a, bytes, s * event.in_use_factor);
  tuner_.remeasured(collective, bytes, event.before, event.after);
  if (rank_ == 0) {
    std::string measured;
    for (auto [a, s] : event.measured_seconds) {
      measured += fmt::format(" {}={:.3f}ms", algorithm_name(a), s * 1e3);
    }
    // A switch in one of world rank 0's groups is news (one voice per layout: the other groups
    // of its kind see the same machine); a re-measure that kept the algorithm, or another
    // group's switch, is detail.
    std::string again;
    for (auto [a, s] : event.confirmed_seconds) {
      again += fmt::format(" {}={:.3f}ms", algorithm_name(a), s * 1e3);
    }
    if (!again.empty()) {
      again = fmt::format("; measured again:{} ({})", again,
                          event.after != event.before ? "the gain held" : "the gain did not hold");
    }
    const bool news = event.after != event.before && transport_->world_rank() == 0;
    spdlog::log(news ? spdlog::level::info : spdlog::level::debug,
                "comm tuner{}{}: {} of {} bytes on group '{}' ran {:.2f}x slower than predicted; "
                "re-measured:{}{}; {} -> {} (in use {:.2f}x the re-measured time)",
                when.empty() ? "" : " ", when, collective_name(collective), bytes, name_, slowdown,
                measured, again, algorithm_name(event.before), algorithm_name(event.after),
                event.in_use_factor);
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
