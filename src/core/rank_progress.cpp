#include "core/rank_progress.h"

#include <array>
#include <atomic>

namespace lattice {
namespace {

std::atomic<ProgressSink*> g_sink{nullptr};
// The phase of the training thread, so that a PhaseScope can restore it.
std::atomic<Phase> g_phase{Phase::kStarting};

constexpr std::array<std::string_view, kPhaseCount> kPhaseNames = {
    "starting", "forward",    "backward", "collective", "optimizer",
    "snapshot", "checkpoint", "recovery", "evaluate",   "finishing"};

}  // namespace

std::string_view phase_name(Phase phase) {
  return kPhaseNames[size_t(phase)];
}

bool parse_phase(std::string_view name, Phase& phase) {
  for (size_t i = 0; i < kPhaseNames.size(); ++i) {
    if (kPhaseNames[i] == name) {
      phase = Phase(i);
      return true;
    }
  }
  return false;
}

void set_progress_sink(ProgressSink* sink) {
  g_sink.store(sink, std::memory_order_release);
}

void report_step(int64_t step) {
  if (ProgressSink* sink = g_sink.load(std::memory_order_acquire)) sink->on_step(step);
}

void report_phase(Phase phase) {
  g_phase.store(phase, std::memory_order_relaxed);
  if (ProgressSink* sink = g_sink.load(std::memory_order_acquire)) sink->on_phase(phase);
}

void report_progress() {
  if (ProgressSink* sink = g_sink.load(std::memory_order_acquire)) sink->on_progress();
}

void report_nested_phase(Phase phase) {
  if (ProgressSink* sink = g_sink.load(std::memory_order_acquire)) sink->on_nested_phase(phase);
}

CollectiveReport::CollectiveReport(std::string_view group, uint64_t seq)
    : sink_(g_sink.load(std::memory_order_acquire)) {
  if (sink_ != nullptr) sink_->on_collective(group, seq);
}

CollectiveReport::~CollectiveReport() {
  if (sink_ != nullptr) sink_->on_collective_end();
}

PhaseScope::PhaseScope(Phase phase) : previous_(g_phase.load(std::memory_order_relaxed)) {
  report_phase(phase);
}

PhaseScope::~PhaseScope() {
  report_phase(previous_);
}

}  // namespace lattice
