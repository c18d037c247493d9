// A rank's events as a Chrome/Perfetto trace (the JSON "Trace Event Format", opened by
// ui.perfetto.dev and chrome://tracing): one file per rank, pid = rank, one lane (tid) per
// TraceCategory, "ph":"X" complete events with ts/dur in microseconds, and "M" metadata naming
// the process "rank N" and each lane used after its category. Loading several ranks' files
// together shows them one above the other on the shared time origin.
#pragma once

#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "trace/event_recorder.h"
#include "trace/trace_event.h"

namespace lattice {

// "trace_rank<N>.json", the name of rank N's file inside a trace directory.
std::string chrome_trace_file_name(int rank);

// The lane (Chrome "tid") of a category: its enum value, the same on every rank.
int chrome_trace_lane(TraceCategory category);

// The trace document of one rank, as JSON text.
std::string chrome_trace_json(int rank, std::span<const TraceEvent> events);

// Writes the document to `path` atomically (core/atomic_file.h): a reader sees the previous
// file or the complete new one. The directory must exist.
void write_chrome_trace(const std::filesystem::path& path, int rank,
                        std::span<const TraceEvent> events);

// Writes the recorder's events to dir/chrome_trace_file_name(rank), creating `dir` if needed
// (the `--trace DIR` layout). Returns the file's path.
std::filesystem::path write_chrome_trace_to_dir(const std::filesystem::path& dir,
                                                const EventRecorder& recorder);

struct RankTrace {
  int rank = 0;
  std::vector<TraceEvent> events;  // in file order (the order they were recorded)
};

// Reads a file written by write_chrome_trace back into events (for offline summaries). Times
// come back to the nanosecond. Throws IoError if it cannot be read, ValueError if it is not a
// Lattice trace.
RankTrace read_chrome_trace(const std::filesystem::path& path);

}  // namespace lattice
