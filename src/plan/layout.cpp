#include "plan/layout.h"

#include <fmt/format.h>

namespace lattice::plan {

std::string describe_layer_counts(const std::vector<int64_t>& counts) {
  // Runs of equal counts folded: 7,8×14,7.
  std::string text;
  for (size_t i = 0; i < counts.size();) {
    size_t j = i;
    while (j < counts.size() && counts[j] == counts[i]) ++j;
    if (!text.empty()) text += ",";
    text += j - i > 1 ? fmt::format("{}×{}", counts[i], j - i) : fmt::format("{}", counts[i]);
    i = j;
  }
  return text;
}

bool valid_layer_split(const std::vector<int64_t>& counts, int64_t layers, int64_t pp,
                       bool empty_ends) {
  if (counts.empty() || pp < 1 || int64_t(counts.size()) % pp != 0) return false;
  int64_t sum = 0;
  std::vector<int64_t> per_stage(size_t(pp), 0);
  for (size_t k = 0; k < counts.size(); ++k) {
    const bool end = k == 0 || k + 1 == counts.size();
    if (counts[k] < (empty_ends && end ? 0 : 1)) return false;
    sum += counts[k];
    per_stage[k % size_t(pp)] += counts[k];
  }
  for (int64_t held : per_stage) {
    if (held < 1) return false;
  }
  return sum == layers;
}

std::string describe(const Layout& l) {
  std::string text = fmt::format("dp={} tp={} pp={}", l.dp, l.tp, l.pp);
  if (l.cp > 1) text += fmt::format(" cp={}", l.cp);
  if (l.ep > 1) text += fmt::format(" ep={}", l.ep);
  if (l.virtual_stages > 1) text += fmt::format(" v={}", l.virtual_stages);
  text += fmt::format(" zero={} mb={} recompute={}", l.zero, l.micro_batch,
                      recompute_name(l.recompute));
  if (l.sequence_parallel) text += " sp";
  if (l.pp > 1) text += fmt::format(" schedule={}", schedule_kind_name(l.schedule));
  if (!l.layers_per_chunk.empty()) text += " layers=" + describe_layer_counts(l.layers_per_chunk);
  return text;
}

}  // namespace lattice::plan
