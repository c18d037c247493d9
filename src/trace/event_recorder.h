// Per-rank event recording (DESIGN.md trace/): code times its work through one event API
// instead of ad-hoc timers, and the events become a Chrome/Perfetto trace (chrome_trace.h) and a
// summary (trace_summary.h).
//
// Ownership. One EventRecorder per rank. In-process ranks are threads, so there is no global
// recorder: whoever starts a rank creates its recorder and passes it down explicitly
// (EventRecorder* may be null, which records nothing). Code too deep to take a parameter uses
// the thread's *current* recorder, a thread_local pointer installed for a region with
// ScopedCurrentRecorder on the rank's thread; TraceScope's constructor without a recorder uses
// it. A helper thread of the rank (its communication thread) installs the same recorder on
// itself; record() is guarded by a mutex so the rank's threads may share one recorder.
//
// Time. Event times are steady-clock nanoseconds since an origin passed in at construction.
// Give every rank of a process the same origin so their traces line up; ranks in different
// processes line up as well as their origins do (take each right after a barrier).
//
// Cost when disabled: record() and TraceScope test one flag and return; the event's name is
// not copied and no clock is read (~2-3 ns per scope). Arguments written in the braces are still
// built by the caller (~10 ns for two); attach costly ones with TraceScope::add_arg.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <mutex>
#include <string_view>
#include <vector>

#include "trace/trace_event.h"

namespace lattice {

using TraceClock = std::chrono::steady_clock;

class EventRecorder {
 public:
  EventRecorder(int rank, TraceClock::time_point origin, bool enabled = true);
  EventRecorder(const EventRecorder&) = delete;
  EventRecorder& operator=(const EventRecorder&) = delete;

  int rank() const { return rank_; }
  TraceClock::time_point origin() const { return origin_; }
  // Nanoseconds from the origin to now.
  int64_t now_ns() const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(TraceClock::now() - origin_)
        .count();
  }

  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  // Turns recording on or off, e.g. to trace only a few steps of a long run.
  void set_enabled(bool enabled) { enabled_.store(enabled, std::memory_order_relaxed); }

  // Appends one event (when enabled). The times are ns from the origin; end_ns >= start_ns.
  void record(std::string_view name, TraceCategory category, int64_t start_ns, int64_t end_ns,
              std::initializer_list<TraceArg> args = {}) {
    if (!enabled()) return;
    append(TraceEvent{std::string(name), category, start_ns, end_ns, args});
  }
  void record(TraceEvent event) {
    if (!enabled()) return;
    append(std::move(event));
  }

  // The events in the order they were recorded (a scope is recorded when it ends, so an inner
  // scope comes before the scope around it). A copy, safe while other threads record.
  std::vector<TraceEvent> events() const;
  size_t size() const;
  // Moves the events out and leaves the recorder empty (e.g. after writing a step's trace).
  std::vector<TraceEvent> take_events();

 private:
  void append(TraceEvent&& event);

  int rank_;
  TraceClock::time_point origin_;
  std::atomic<bool> enabled_;
  mutable std::mutex mutex_;
  std::vector<TraceEvent> events_;
};

// The calling thread's current recorder: null unless a ScopedCurrentRecorder is alive on it.
EventRecorder* current_event_recorder();

// Makes `recorder` the calling thread's current recorder for this object's lifetime, then
// restores the previous one (so regions nest). Create it on the thread that records.
class ScopedCurrentRecorder {
 public:
  explicit ScopedCurrentRecorder(EventRecorder* recorder);
  ~ScopedCurrentRecorder();
  ScopedCurrentRecorder(const ScopedCurrentRecorder&) = delete;
  ScopedCurrentRecorder& operator=(const ScopedCurrentRecorder&) = delete;

 private:
  EventRecorder* previous_;
};

// Records one event covering this object's lifetime (or until finish()):
//   TraceScope scope(recorder, "forward", TraceCategory::kCompute, {{"micro_batch", mb}});
//   TraceScope scope("all_reduce", TraceCategory::kCollective, {{"bytes", n}});  // current
// Nested scopes give nested events: the inner one ends, and is recorded, first.
class TraceScope {
 public:
  TraceScope(EventRecorder* recorder, std::string_view name, TraceCategory category,
             std::initializer_list<TraceArg> args = {}) {
    if (recorder != nullptr && recorder->enabled()) start(recorder, name, category, args);
  }
  // On the calling thread's current recorder (records nothing when there is none).
  TraceScope(std::string_view name, TraceCategory category,
             std::initializer_list<TraceArg> args = {})
      : TraceScope(current_event_recorder(), name, category, args) {}
  ~TraceScope() {
    if (recorder_ != nullptr) finish();
  }
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

  // False when the recorder was null or disabled at construction, or after finish().
  bool recording() const { return recorder_ != nullptr; }
  // Adds an argument known only later (bytes actually received). No-op when not recording.
  void add_arg(TraceArg arg) {
    if (recorder_ != nullptr) event_.args.push_back(std::move(arg));
  }
  // Ends the event now and records it; the destructor then does nothing.
  void finish();

 private:
  void start(EventRecorder* recorder, std::string_view name, TraceCategory category,
             std::initializer_list<TraceArg> args);

  EventRecorder* recorder_ = nullptr;  // null: not recording
  TraceEvent event_;
};

}  // namespace lattice
