// One timed event of one rank: what ran (name), which kind of work it was (category, which also
// picks its lane in the trace viewer), when ([start_ns, end_ns) on the steady clock, relative to
// an origin shared by the ranks of a run) and a few key/value arguments (bytes, micro_batch,
// group, ...).
#pragma once

#include <concepts>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace lattice {

enum class TraceCategory : uint8_t {
  kCompute,     // forward / backward kernels
  kSend,        // point-to-point send (pipeline activations or gradients)
  kRecv,        // point-to-point receive
  kCollective,  // all_reduce, all_gather, reduce_scatter, broadcast, ...; args: bytes, group
  kIdle,        // waiting with nothing to do (pipeline bubble, a wait on a peer)
  kOptimizer,   // gradient clipping and the parameter update
  kData,        // loading and copying a batch
  kCheckpoint,  // saving or loading state
  kStep,        // marks a training step's window; a marker, not work (trace_summary.h)
};
inline constexpr int kTraceCategoryCount = 9;

// "compute", "send", ..., the names used in the trace file's "cat" field and its lane names.
std::string_view trace_category_name(TraceCategory category);
// The inverse of trace_category_name; nullopt for a name that is not a category.
std::optional<TraceCategory> parse_trace_category(std::string_view name);

// A value is an integer, a real or a string, so the trace file keeps the type it was given.
using TraceArgValue = std::variant<int64_t, double, std::string>;

// The constructors take any integer (size_t bytes, int micro-batch) or floating type without
// the caller casting: a variant alone refuses size_t -> int64_t as narrowing.
struct TraceArg {
  template <std::integral T>
  TraceArg(std::string k, T v) : key(std::move(k)), value(static_cast<int64_t>(v)) {}
  template <std::floating_point T>
  TraceArg(std::string k, T v) : key(std::move(k)), value(static_cast<double>(v)) {}
  TraceArg(std::string k, std::string v) : key(std::move(k)), value(std::move(v)) {}
  TraceArg(std::string k, const char* v) : key(std::move(k)), value(std::string(v)) {}

  bool operator==(const TraceArg&) const = default;

  std::string key;
  TraceArgValue value;
};

struct TraceEvent {
  std::string name;
  TraceCategory category = TraceCategory::kCompute;
  int64_t start_ns = 0;
  int64_t end_ns = 0;  // >= start_ns
  std::vector<TraceArg> args = {};

  int64_t duration_ns() const { return end_ns - start_ns; }
  // The integer argument `key`, or nullopt when absent or not an integer.
  std::optional<int64_t> int_arg(std::string_view key) const;

  bool operator==(const TraceEvent&) const = default;
};

}  // namespace lattice
