#include "trace/event_recorder.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <thread>
#include <vector>

#include "core/error.h"

namespace lattice {
namespace {

TEST(TraceEventTest, ArgumentsKeepTheKindOfValueTheyWereGiven) {
  size_t bytes = 4096;
  TraceEvent event{"all_reduce",
                   TraceCategory::kCollective,
                   10,
                   25,
                   {{"bytes", bytes}, {"ratio", 0.5f}, {"group", "dp"}, {"micro_batch", -3}}};
  EXPECT_EQ(event.args[0].value, TraceArgValue(int64_t{4096}));
  EXPECT_EQ(event.args[1].value, TraceArgValue(0.5));
  EXPECT_EQ(event.args[2].value, TraceArgValue(std::string("dp")));
  EXPECT_EQ(event.int_arg("bytes"), 4096);
  EXPECT_EQ(event.int_arg("micro_batch"), -3);
  EXPECT_EQ(event.int_arg("group"), std::nullopt);  // a string, not an integer
  EXPECT_EQ(event.int_arg("missing"), std::nullopt);
  EXPECT_EQ(event.duration_ns(), 15);
}

TEST(TraceEventTest, CategoryNamesRoundTrip) {
  for (int c = 0; c < kTraceCategoryCount; ++c) {
    auto category = static_cast<TraceCategory>(c);
    EXPECT_EQ(parse_trace_category(trace_category_name(category)), category);
  }
  EXPECT_EQ(trace_category_name(TraceCategory::kCollective), "collective");
  EXPECT_EQ(parse_trace_category("bogus"), std::nullopt);
}

TEST(EventRecorderTest, ExplicitRecordsKeepTheirOrderAndFields) {
  EventRecorder recorder(2, TraceClock::now());
  recorder.record("forward", TraceCategory::kCompute, 100, 250, {{"micro_batch", 0}});
  recorder.record("send", TraceCategory::kSend, 250, 260, {{"bytes", 64}});
  recorder.record(TraceEvent{"wait", TraceCategory::kIdle, 260, 400, {}});
  std::vector<TraceEvent> events = recorder.events();
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(recorder.rank(), 2);
  EXPECT_EQ(events[0],
            (TraceEvent{"forward", TraceCategory::kCompute, 100, 250, {{"micro_batch", 0}}}));
  EXPECT_EQ(events[1], (TraceEvent{"send", TraceCategory::kSend, 250, 260, {{"bytes", 64}}}));
  EXPECT_EQ(events[2].name, "wait");
  EXPECT_EQ(events[2].category, TraceCategory::kIdle);
}

TEST(EventRecorderTest, NestedScopesRecordInnerFirstAndNestTheirIntervals) {
  EventRecorder recorder(0, TraceClock::now());
  {
    TraceScope step(&recorder, "step", TraceCategory::kStep, {{"step", 7}});
    { TraceScope forward(&recorder, "forward", TraceCategory::kCompute); }
    {
      TraceScope reduce(&recorder, "all_reduce", TraceCategory::kCollective, {{"bytes", 8}});
      reduce.add_arg({"group", "dp"});
    }
  }
  std::vector<TraceEvent> events = recorder.events();
  ASSERT_EQ(events.size(), 3u);
  const TraceEvent& forward = events[0];
  const TraceEvent& reduce = events[1];
  const TraceEvent& step = events[2];
  EXPECT_EQ(forward.name, "forward");
  EXPECT_EQ(reduce.name, "all_reduce");
  EXPECT_EQ(step.name, "step");
  EXPECT_EQ(step.category, TraceCategory::kStep);
  EXPECT_EQ(step.int_arg("step"), 7);
  EXPECT_EQ(reduce.args, (std::vector<TraceArg>{{"bytes", 8}, {"group", "dp"}}));
  // The steady clock never goes back: siblings follow each other inside their parent.
  EXPECT_LE(step.start_ns, forward.start_ns);
  EXPECT_LE(forward.start_ns, forward.end_ns);
  EXPECT_LE(forward.end_ns, reduce.start_ns);
  EXPECT_LE(reduce.start_ns, reduce.end_ns);
  EXPECT_LE(reduce.end_ns, step.end_ns);
}

TEST(EventRecorderTest, FinishRecordsOnceAndEndsTheScope) {
  EventRecorder recorder(0, TraceClock::now());
  {
    TraceScope scope(&recorder, "load", TraceCategory::kData);
    EXPECT_TRUE(scope.recording());
    scope.finish();
    EXPECT_FALSE(scope.recording());
    scope.add_arg({"ignored", 1});  // after finish: nothing to add to
    scope.finish();
  }
  ASSERT_EQ(recorder.size(), 1u);
  EXPECT_TRUE(recorder.events()[0].args.empty());
}

TEST(EventRecorderTest, DisabledRecorderRecordsNothing) {
  EventRecorder recorder(0, TraceClock::now(), /*enabled=*/false);
  recorder.record("forward", TraceCategory::kCompute, 0, 10);
  recorder.record(TraceEvent{"backward", TraceCategory::kCompute, 10, 30, {}});
  {
    TraceScope scope(&recorder, "step", TraceCategory::kStep, {{"step", 1}});
    EXPECT_FALSE(scope.recording());
    scope.add_arg({"bytes", 1});
    ScopedCurrentRecorder current(&recorder);
    TraceScope deep("matmul", TraceCategory::kCompute);
    EXPECT_FALSE(deep.recording());
  }
  EXPECT_EQ(recorder.size(), 0u);

  // Turned on, the same calls record; turned off again, they stop.
  recorder.set_enabled(true);
  recorder.record("forward", TraceCategory::kCompute, 0, 10);
  { TraceScope scope(&recorder, "step", TraceCategory::kStep); }
  recorder.set_enabled(false);
  recorder.record("backward", TraceCategory::kCompute, 10, 30);
  std::vector<TraceEvent> events = recorder.events();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].name, "forward");
  EXPECT_EQ(events[1].name, "step");
}

TEST(EventRecorderTest, NullRecorderAndNoCurrentRecorderRecordNothing) {
  ASSERT_EQ(current_event_recorder(), nullptr);
  TraceScope explicit_null(nullptr, "forward", TraceCategory::kCompute);
  TraceScope no_current("forward", TraceCategory::kCompute);
  EXPECT_FALSE(explicit_null.recording());
  EXPECT_FALSE(no_current.recording());
}

TEST(EventRecorderTest, TakeEventsEmptiesTheRecorder) {
  EventRecorder recorder(0, TraceClock::now());
  recorder.record("a", TraceCategory::kCompute, 0, 1);
  recorder.record("b", TraceCategory::kCompute, 1, 2);
  std::vector<TraceEvent> taken = recorder.take_events();
  ASSERT_EQ(taken.size(), 2u);
  EXPECT_EQ(taken[1].name, "b");
  EXPECT_EQ(recorder.size(), 0u);
  recorder.record("c", TraceCategory::kCompute, 2, 3);
  EXPECT_EQ(recorder.events().at(0).name, "c");
}

TEST(EventRecorderTest, AnEventEndingBeforeItStartsIsRefused) {
  EventRecorder recorder(0, TraceClock::now());
  EXPECT_THROW(recorder.record("backwards", TraceCategory::kCompute, 20, 10), ContractError);
  EXPECT_EQ(recorder.size(), 0u);
}

TEST(EventRecorderTest, TimesCountFromTheSharedOrigin) {
  // Two ranks of one process share an origin, so one's later event is later on both clocks.
  TraceClock::time_point origin = TraceClock::now() - std::chrono::seconds(5);
  EventRecorder first(0, origin), second(1, origin);
  { TraceScope scope(&first, "forward", TraceCategory::kCompute); }
  { TraceScope scope(&second, "forward", TraceCategory::kCompute); }
  const TraceEvent a = first.events().at(0), b = second.events().at(0);
  EXPECT_GE(a.start_ns, 5'000'000'000);  // the origin lies 5 s before the recorders existed
  EXPECT_LE(a.end_ns, b.start_ns);
  EXPECT_EQ(first.origin(), second.origin());
}

TEST(EventRecorderTest, CurrentRecorderIsPerThreadAndRestoredOnExit) {
  // Thread ranks: each thread installs its own rank's recorder; deep code records without one.
  constexpr int kRanks = 3;
  TraceClock::time_point origin = TraceClock::now();
  std::vector<std::unique_ptr<EventRecorder>> recorders;
  for (int rank = 0; rank < kRanks; ++rank) {
    recorders.push_back(std::make_unique<EventRecorder>(rank, origin));
  }
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kRanks; ++rank) {
    threads.emplace_back([&, rank] {
      ScopedCurrentRecorder current(recorders[rank].get());
      for (int i = 0; i <= rank; ++i) {
        TraceScope scope("layer", TraceCategory::kCompute, {{"rank", rank}, {"i", i}});
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int rank = 0; rank < kRanks; ++rank) {
    std::vector<TraceEvent> events = recorders[rank]->events();
    ASSERT_EQ(events.size(), size_t(rank + 1));
    for (int i = 0; i <= rank; ++i) {
      EXPECT_EQ(events[i].int_arg("rank"), rank);
      EXPECT_EQ(events[i].int_arg("i"), i);
    }
  }

  // Regions nest: the inner one's recorder is current inside it, the outer one's after it.
  EventRecorder outer(0, origin), inner(1, origin);
  {
    ScopedCurrentRecorder outer_region(&outer);
    {
      ScopedCurrentRecorder inner_region(&inner);
      EXPECT_EQ(current_event_recorder(), &inner);
    }
    EXPECT_EQ(current_event_recorder(), &outer);
  }
  EXPECT_EQ(current_event_recorder(), nullptr);
}

TEST(EventRecorderTest, ThreadsOfOneRankMayShareItsRecorder) {
  // A rank's compute thread and communication thread both record into the rank's recorder.
  constexpr int kThreads = 4, kEventsPerThread = 500;
  EventRecorder recorder(0, TraceClock::now());
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEventsPerThread; ++i) {
        recorder.record("work", TraceCategory::kCompute, i, i + 1, {{"thread", t}});
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  std::vector<int> per_thread(kThreads, 0);
  for (const TraceEvent& event : recorder.events()) ++per_thread.at(*event.int_arg("thread"));
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(per_thread[t], kEventsPerThread);
}

}  // namespace
}  // namespace lattice
