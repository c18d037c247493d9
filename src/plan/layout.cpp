#include "plan/layout.h"

#include <fmt/format.h>

namespace lattice::plan {

std::string describe(const Layout& l) {
  std::string text = fmt::format("dp={} tp={} pp={}", l.dp, l.tp, l.pp);
  if (l.virtual_stages > 1) text += fmt::format(" v={}", l.virtual_stages);
  text += fmt::format(" zero={} mb={} recompute={}", l.zero, l.micro_batch,
                      recompute_name(l.recompute));
  if (l.sequence_parallel) text += " sp";
  if (l.pp > 1) text += fmt::format(" schedule={}", schedule_kind_name(l.schedule));
  return text;
}

}  // namespace lattice::plan
