#include "trace/chrome_trace.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "support/scratch_dir.h"

namespace lattice {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class ChromeTraceTest : public testing::ScratchDirTest {
 protected:
  static json parse_file(const fs::path& path) {
    std::ifstream in(path);
    return json::parse(in);
  }
  // The metadata entry `name` for (pid, tid), or null.
  static json find_metadata(const json& trace, const std::string& name, int pid, int tid) {
    for (const json& entry : trace["traceEvents"]) {
      if (entry["ph"] == "M" && entry["name"] == name && entry["pid"] == pid &&
          entry["tid"] == tid) {
        return entry;
      }
    }
    return nullptr;
  }
};

// A rank's step: data, two forwards, a send with nanosecond-odd times, an idle wait, a
// collective and the optimizer; times far from the origin to check precision.
std::vector<TraceEvent> sample_events() {
  constexpr int64_t kBase = 123'456'789'012;  // ~2 minutes into the run
  return {
      {"step", TraceCategory::kStep, kBase, kBase + 9'000, {{"step", 3}}},
      {"load batch", TraceCategory::kData, kBase, kBase + 1'001, {}},
      {"forward",
       TraceCategory::kCompute,
       kBase + 1'001,
       kBase + 2'503,
       {{"micro_batch", 0}, {"chunk", 1}}},
      {"send activations",
       TraceCategory::kSend,
       kBase + 2'503,
       kBase + 2'507,
       {{"bytes", size_t{1} << 40}, {"peer", 3}}},
      {"forward", TraceCategory::kCompute, kBase + 2'507, kBase + 4'000, {{"micro_batch", 1}}},
      {"bubble", TraceCategory::kIdle, kBase + 4'000, kBase + 5'999, {}},
      {"all_reduce",
       TraceCategory::kCollective,
       kBase + 5'999,
       kBase + 8'000,
       {{"bytes", 65536}, {"group", "dp"}, {"algbw", 2.75}}},
      {"adamw", TraceCategory::kOptimizer, kBase + 8'000, kBase + 9'000, {}},
  };
}

TEST_F(ChromeTraceTest, WrittenFileHoldsCompleteEventsOnePidAndALanePerCategory) {
  constexpr int kRank = 5;
  std::vector<TraceEvent> events = sample_events();
  fs::path path = dir_ / "trace.json";
  write_chrome_trace(path, kRank, events);
  json trace = parse_file(path);

  EXPECT_EQ(trace["otherData"]["rank"], kRank);
  std::vector<json> complete;
  for (const json& entry : trace["traceEvents"]) {
    EXPECT_EQ(entry["pid"], kRank);
    if (entry["ph"] == "X") complete.push_back(entry);
  }
  ASSERT_EQ(complete.size(), events.size());
  for (size_t i = 0; i < events.size(); ++i) {
    SCOPED_TRACE(events[i].name);
    EXPECT_EQ(complete[i]["name"], events[i].name);
    EXPECT_EQ(complete[i]["cat"], trace_category_name(events[i].category));
    EXPECT_EQ(complete[i]["tid"], chrome_trace_lane(events[i].category));
    // Microseconds, to the nanosecond.
    EXPECT_EQ(std::llround(complete[i]["ts"].get<double>() * 1e3), events[i].start_ns);
    EXPECT_EQ(std::llround(complete[i]["dur"].get<double>() * 1e3), events[i].duration_ns());
  }
  EXPECT_EQ(complete[3]["args"]["bytes"], int64_t{1} << 40);
  EXPECT_EQ(complete[3]["args"]["peer"], 3);
  EXPECT_EQ(complete[6]["args"]["group"], "dp");
  EXPECT_EQ(complete[6]["args"]["algbw"], 2.75);
  EXPECT_EQ(complete[2]["args"]["micro_batch"], 0);
  EXPECT_EQ(complete[1]["args"], json::object());

  // Metadata: the process is "rank 5"; each category used has its lane named, the others none.
  EXPECT_EQ(find_metadata(trace, "process_name", kRank, 0)["args"]["name"], "rank 5");
  EXPECT_EQ(find_metadata(trace, "process_sort_index", kRank, 0)["args"]["sort_index"], kRank);
  for (int lane = 0; lane < kTraceCategoryCount; ++lane) {
    auto category = static_cast<TraceCategory>(lane);
    json name = find_metadata(trace, "thread_name", kRank, lane);
    if (category == TraceCategory::kRecv || category == TraceCategory::kCheckpoint) {
      EXPECT_TRUE(name.is_null()) << trace_category_name(category);
    } else {
      EXPECT_EQ(name["args"]["name"], trace_category_name(category));
    }
  }
}

TEST_F(ChromeTraceTest, ReadingBackGivesTheSameEvents) {
  std::vector<TraceEvent> events = sample_events();
  fs::path path = dir_ / "trace.json";
  write_chrome_trace(path, 1, events);
  RankTrace trace = read_chrome_trace(path);
  EXPECT_EQ(trace.rank, 1);
  EXPECT_EQ(trace.events, events);  // names, categories, ns times, args with kinds and order
}

TEST_F(ChromeTraceTest, AnEmptyRecorderWritesATraceWithOnlyTheProcessName) {
  EventRecorder recorder(0, TraceClock::now());
  fs::path path = write_chrome_trace_to_dir(dir_, recorder);
  json trace = parse_file(path);
  ASSERT_EQ(trace["traceEvents"].size(), 2u);  // process_name and process_sort_index
  EXPECT_EQ(find_metadata(trace, "process_name", 0, 0)["args"]["name"], "rank 0");
  EXPECT_TRUE(read_chrome_trace(path).events.empty());
}

TEST_F(ChromeTraceTest, TraceDirectoryHoldsOneFilePerRankAndNoTemporaries) {
  fs::path trace_dir = dir_ / "run" / "trace";  // created on demand
  TraceClock::time_point origin = TraceClock::now();
  for (int rank = 0; rank < 3; ++rank) {
    EventRecorder recorder(rank, origin);
    recorder.record("forward", TraceCategory::kCompute, 10 * rank, 10 * rank + 5, {{"rank", rank}});
    fs::path path = write_chrome_trace_to_dir(trace_dir, recorder);
    EXPECT_EQ(path, trace_dir / chrome_trace_file_name(rank));
  }
  // Rewriting a rank's file replaces it whole.
  EventRecorder again(1, origin);
  again.record("backward", TraceCategory::kCompute, 0, 7);
  write_chrome_trace_to_dir(trace_dir, again);

  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(trace_dir)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names,
            (std::vector<std::string>{"trace_rank0.json", "trace_rank1.json", "trace_rank2.json"}));
  RankTrace rank1 = read_chrome_trace(trace_dir / "trace_rank1.json");
  ASSERT_EQ(rank1.events.size(), 1u);
  EXPECT_EQ(rank1.events[0].name, "backward");
  RankTrace rank2 = read_chrome_trace(trace_dir / "trace_rank2.json");
  EXPECT_EQ(rank2.rank, 2);
  EXPECT_EQ(rank2.events.at(0),
            (TraceEvent{"forward", TraceCategory::kCompute, 20, 25, {{"rank", 2}}}));
}

TEST_F(ChromeTraceTest, ReadingSomethingElseFailsWithTheFileNamed) {
  EXPECT_THROW(read_chrome_trace(dir_ / "missing.json"), IoError);
  fs::path not_json = dir_ / "notes.txt";
  std::ofstream(not_json) << "not json at all";
  EXPECT_THROW(read_chrome_trace(not_json), ValueError);
  fs::path foreign = dir_ / "foreign.json";
  std::ofstream(foreign) << R"({"traceEvents": [], "otherData": {"rank": 0}})";
  EXPECT_TRUE(read_chrome_trace(foreign).events.empty());
  std::ofstream(foreign) << R"({"traceEvents": [{"ph": "X", "name": "x", "cat": "gpu", "ts": 0,
                                "dur": 1}], "otherData": {"rank": 0}})";
  try {
    read_chrome_trace(foreign);
    FAIL() << "unknown category accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("foreign.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("gpu"), std::string::npos) << e.what();
  }
  std::ofstream(foreign) << R"({"traceEvents": [{"ph": "X", "name": "x", "cat": "compute"}],
                                "otherData": {"rank": 0}})";
  EXPECT_THROW(read_chrome_trace(foreign), ValueError);  // no ts / dur
}

}  // namespace
}  // namespace lattice
