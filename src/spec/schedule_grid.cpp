#include "spec/schedule_grid.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "core/error.h"

namespace lattice {

namespace {

std::string cell_label(const Instruction& in, int virtual_stages) {
  char letter = '?';
  switch (in.op) {
    case Op::kForward:
      letter = 'F';
      break;
    case Op::kBackward:
      letter = 'B';
      break;
    case Op::kBackwardInput:
      letter = 'b';
      break;
    case Op::kBackwardWeight:
      letter = 'w';
      break;
    default:
      LATTICE_CHECK(false, "only compute instructions are drawn, got {}", describe(in));
  }
  if (virtual_stages > 1) return fmt::format("{}{}.{}", letter, in.micro_batch, in.chunk);
  return fmt::format("{}{}", letter, in.micro_batch);
}

std::string percent(double fraction) {
  return fmt::format("{:.1f}%", 100.0 * fraction);
}

}  // namespace

std::string render_schedule_grid(const Schedule& schedule, const Timeline& timeline) {
  const auto p = size_t(schedule.stages);
  if (timeline.ranks.size() != p)
    LATTICE_THROW(ValueError,
                  "schedule grid: the timeline has {} ranks but the schedule {} ---> HINT: pass "
                  "simulate(schedule) of the same schedule",
                  timeline.ranks.size(), p);

  // cells[r][t]: what rank r computes during time unit t.
  const auto slots = size_t(timeline.makespan);
  std::vector<std::vector<std::string>> cells(p, std::vector<std::string>(slots, "."));
  size_t width = 1;
  for (size_t r = 0; r < p; ++r) {
    for (const TimedInstruction& timed : timeline.ranks[r].compute) {
      const std::string label = cell_label(timed.instruction, schedule.virtual_stages);
      width = std::max(width, label.size());
      if (timed.start < 0 || timed.end > timeline.makespan || timed.start > timed.end)
        LATTICE_THROW(ValueError, "schedule grid: rank {} {} spans [{}, {}) outside the step", r,
                      describe(timed.instruction), timed.start, timed.end);
      for (int64_t t = timed.start; t < timed.end; ++t) cells[r][size_t(t)] = label;
    }
  }

  std::string out = fmt::format("{} schedule (p={} m={} v={}), {} time units\n",
                                schedule_kind_name(schedule.kind), schedule.stages,
                                schedule.micro_batches, schedule.virtual_stages, slots);
  const size_t rank_width = fmt::format("{}", p - 1).size();
  for (size_t r = 0; r < p; ++r) {
    std::string row = fmt::format("rank {:<{}} |", r, rank_width);
    for (const std::string& cell : cells[r]) row += fmt::format(" {:<{}}", cell, width);
    row.erase(row.find_last_not_of(' ') + 1);
    out += row + "\n";
  }

  out += "peak in-flight micro-batches per stage:";
  for (int peak : peak_in_flight(schedule)) out += fmt::format(" {}", peak);
  if (schedule.virtual_stages > 1)
    out +=
        fmt::format(" (counted per chunk: 1/{} of a stage's layers each)", schedule.virtual_stages);
  out += "\n";

  const BubbleFraction bubble = bubble_fraction(timeline);
  out += "bubble fraction per stage:";
  for (double share : bubble.per_rank) out += fmt::format(" {}", percent(share));
  out += fmt::format("; overall {}\n", percent(bubble.overall));
  return out;
}

}  // namespace lattice
