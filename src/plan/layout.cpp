#include "plan/layout.h"

#include <fmt/format.h>

#include "core/error.h"

namespace lattice::plan {

std::string describe(const Layout& l) {
  std::string text = fmt::format("dp={} tp={} pp={}", l.dp, l.tp, l.pp);
  if (l.virtual_stages > 1) text += fmt::format(" v={}", l.virtual_stages);
  text += fmt::format(" zero={} mb={} recompute={}", l.zero, l.micro_batch,
                      recompute_name(l.recompute));
  if (l.sequence_parallel) text += " sp";
  if (l.pp > 1) text += fmt::format(" schedule={}", schedule_name(l.schedule));
  return text;
}

std::string_view schedule_name(Schedule s) {
  switch (s) {
    case Schedule::kOneFOneB:
      return "1f1b";
    case Schedule::kInterleaved:
      return "interleaved";
    case Schedule::kGpipe:
      return "gpipe";
    case Schedule::kZbH1:
      return "zb-h1";
  }
  return "?";
}

std::string_view recompute_name(Recompute r) {
  switch (r) {
    case Recompute::kNone:
      return "none";
    case Recompute::kSelective:
      return "selective";
    case Recompute::kFull:
      return "full";
  }
  return "?";
}

Schedule parse_schedule(std::string_view name) {
  for (Schedule s :
       {Schedule::kOneFOneB, Schedule::kInterleaved, Schedule::kGpipe, Schedule::kZbH1}) {
    if (name == schedule_name(s)) return s;
  }
  LATTICE_THROW(ConfigError,
                "unknown pipeline schedule '{}' ---> HINT: use 1f1b, interleaved, "
                "gpipe or zb-h1",
                name);
}

Recompute parse_recompute(std::string_view name) {
  for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    if (name == recompute_name(r)) return r;
  }
  LATTICE_THROW(ConfigError, "unknown recompute mode '{}' ---> HINT: use none, selective or full",
                name);
}

}  // namespace lattice::plan
