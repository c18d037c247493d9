#include "trace/event_recorder.h"

#include <utility>

#include "core/error.h"

namespace lattice {

namespace {

// Per thread, because in-process ranks are threads: each rank's threads see their own rank's
// recorder (event_recorder.h).
thread_local EventRecorder* tls_current_recorder = nullptr;

}  // namespace

EventRecorder::EventRecorder(int rank, TraceClock::time_point origin, bool enabled)
    : rank_(rank), origin_(origin), enabled_(enabled) {
  LATTICE_CHECK_GE(rank, 0, "an event recorder belongs to a rank >= 0");
}

void EventRecorder::append(TraceEvent&& event) {
  LATTICE_CHECK_LE(event.start_ns, event.end_ns,
                   "trace event '{}' on rank {} ends before it starts", event.name, rank_);
  std::lock_guard lock(mutex_);
  events_.push_back(std::move(event));
}

std::vector<TraceEvent> EventRecorder::events() const {
  std::lock_guard lock(mutex_);
  return events_;
}

size_t EventRecorder::size() const {
  std::lock_guard lock(mutex_);
  return events_.size();
}

std::vector<TraceEvent> EventRecorder::take_events() {
  std::lock_guard lock(mutex_);
  return std::exchange(events_, {});
}

EventRecorder* current_event_recorder() {
  return tls_current_recorder;
}

ScopedCurrentRecorder::ScopedCurrentRecorder(EventRecorder* recorder)
    : previous_(std::exchange(tls_current_recorder, recorder)) {}

ScopedCurrentRecorder::~ScopedCurrentRecorder() {
  tls_current_recorder = previous_;
}

void TraceScope::start(EventRecorder* recorder, std::string_view name, TraceCategory category,
                       std::initializer_list<TraceArg> args) {
  recorder_ = recorder;
  event_.name = name;
  event_.category = category;
  event_.args = args;
  // The clock is read last so that building the event is not part of its duration.
  event_.start_ns = recorder->now_ns();
}

void TraceScope::finish() {
  if (recorder_ == nullptr) return;
  event_.end_ns = recorder_->now_ns();
  std::exchange(recorder_, nullptr)->record(std::move(event_));
}

}  // namespace lattice
