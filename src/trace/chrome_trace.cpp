#include "trace/chrome_trace.h"

#include <fmt/format.h>

#include <array>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"

namespace lattice {

namespace fs = std::filesystem;
// ordered_json keeps the arguments in the order they were given, so a file reads back into
// equal events.
using json = nlohmann::ordered_json;

namespace {

// The Trace Event Format counts time in microseconds; ours is nanoseconds. A double holds
// ns / 1000 exactly enough to come back to the same nanosecond for any run shorter than
// ~100 days (2^53 ns), which read_chrome_trace relies on.
double ns_to_us(int64_t ns) {
  return double(ns) / 1e3;
}
int64_t us_to_ns(double us) {
  return std::llround(us * 1e3);
}

json args_to_json(const std::vector<TraceArg>& args) {
  json out = json::object();
  for (const TraceArg& arg : args) {
    std::visit([&](const auto& value) { out[arg.key] = value; }, arg.value);
  }
  return out;
}

std::vector<TraceArg> args_from_json(const json& args, const fs::path& path) {
  std::vector<TraceArg> out;
  for (const auto& [key, value] : args.items()) {
    if (value.is_number_integer()) {
      out.emplace_back(key, value.get<int64_t>());
    } else if (value.is_number_float()) {
      out.emplace_back(key, value.get<double>());
    } else if (value.is_string()) {
      out.emplace_back(key, value.get<std::string>());
    } else {
      LATTICE_THROW(ValueError, "trace {}: argument '{}' is {}, not a number or a string",
                    path.string(), key, value.type_name());
    }
  }
  return out;
}

json metadata(std::string_view name, int rank, int lane, json args) {
  return {{"name", name}, {"ph", "M"}, {"pid", rank}, {"tid", lane}, {"args", std::move(args)}};
}

}  // namespace

std::string chrome_trace_file_name(int rank) {
  return fmt::format("trace_rank{}.json", rank);
}

int chrome_trace_lane(TraceCategory category) {
  return static_cast<int>(category);
}

std::string chrome_trace_json(int rank, std::span<const TraceEvent> events) {
  json trace_events = json::array();
  trace_events.push_back(
      metadata("process_name", rank, 0, {{"name", fmt::format("rank {}", rank)}}));
  // Ranks sort by number in the viewer, not by the order their files were loaded.
  trace_events.push_back(metadata("process_sort_index", rank, 0, {{"sort_index", rank}}));
  std::array<bool, kTraceCategoryCount> lane_used{};
  for (const TraceEvent& event : events) lane_used[chrome_trace_lane(event.category)] = true;
  for (int lane = 0; lane < kTraceCategoryCount; ++lane) {
    if (!lane_used[lane]) continue;
    std::string_view name = trace_category_name(static_cast<TraceCategory>(lane));
    trace_events.push_back(metadata("thread_name", rank, lane, {{"name", name}}));
    trace_events.push_back(metadata("thread_sort_index", rank, lane, {{"sort_index", lane}}));
  }
  for (const TraceEvent& event : events) {
    trace_events.push_back({{"name", event.name},
                            {"cat", trace_category_name(event.category)},
                            {"ph", "X"},
                            {"ts", ns_to_us(event.start_ns)},
                            {"dur", ns_to_us(event.duration_ns())},
                            {"pid", rank},
                            {"tid", chrome_trace_lane(event.category)},
                            {"args", args_to_json(event.args)}});
  }
  json document = {{"traceEvents", std::move(trace_events)},
                   {"displayTimeUnit", "ns"},
                   {"otherData", {{"rank", rank}, {"clock", "steady, from the run's origin"}}}};
  return document.dump();
}

void write_chrome_trace(const fs::path& path, int rank, std::span<const TraceEvent> events) {
  std::string text = chrome_trace_json(rank, events);
  AtomicFileWriter writer(path);
  writer.write(text.data(), text.size());
  writer.commit();
}

fs::path write_chrome_trace_to_dir(const fs::path& dir, const EventRecorder& recorder) {
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) {
    LATTICE_THROW(IoError,
                  "cannot create trace directory {}: {} ---> HINT: pass a writable --trace DIR",
                  dir.string(), error.message());
  }
  fs::path path = dir / chrome_trace_file_name(recorder.rank());
  write_chrome_trace(path, recorder.rank(), recorder.events());
  return path;
}

RankTrace read_chrome_trace(const fs::path& path) {
  std::ifstream in(path);
  if (!in) LATTICE_THROW(IoError, "cannot open trace {}", path.string());
  json document = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (document.is_discarded() || !document.is_object() || !document.contains("traceEvents") ||
      !document.contains("otherData") || !document["otherData"].contains("rank")) {
    LATTICE_THROW(ValueError,
                  "{} is not a Lattice trace (JSON with traceEvents and otherData.rank) ---> "
                  "HINT: pass a trace_rank<N>.json written by --trace",
                  path.string());
  }
  RankTrace trace;
  try {
    trace.rank = document["otherData"]["rank"].get<int>();
    for (const json& entry : document["traceEvents"]) {
      if (entry.value("ph", "") != "X") continue;  // metadata
      std::string category_name = entry.at("cat").get<std::string>();
      std::optional<TraceCategory> category = parse_trace_category(category_name);
      if (!category) {
        LATTICE_THROW(ValueError, "trace {}: event '{}' has unknown category '{}'", path.string(),
                      entry.value("name", ""), category_name);
      }
      int64_t start_ns = us_to_ns(entry.at("ts").get<double>());
      int64_t end_ns = start_ns + us_to_ns(entry.at("dur").get<double>());
      trace.events.push_back({entry.at("name").get<std::string>(), *category, start_ns, end_ns,
                              args_from_json(entry.value("args", json::object()), path)});
    }
  } catch (const json::exception& e) {
    // A field missing or of the wrong type: say which file, in the project's error type.
    LATTICE_THROW(ValueError, "trace {} is malformed: {}", path.string(), e.what());
  }
  return trace;
}

}  // namespace lattice
