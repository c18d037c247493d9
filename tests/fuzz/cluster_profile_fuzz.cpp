// The cluster-profile reader (plan/cluster_profile.h) on hostile JSON. What it accepts must
// survive the writer's round trip: a profile `lattice bench calibrate` writes is one `lattice
// plan --cluster` reads back.
#include <cstdio>
#include <cstdlib>

#include "core/error.h"
#include "fuzz/fuzz_target.h"
#include "plan/cluster_profile.h"

LATTICE_FUZZ_TARGET(cluster_profile) {
  using namespace lattice::plan;
  const ClusterSpec cluster =
      parse_cluster_profile(std::string(lattice::fuzz::as_text(input)), "fuzz.json");
  const std::string written = write_cluster_profile(cluster);
  try {
    (void)parse_cluster_profile(written, "fuzz-rewritten.json");
  } catch (const lattice::Error& e) {
    std::fprintf(stderr, "an accepted profile does not read back after writing: %s\n", e.what());
    std::abort();
  }
}
