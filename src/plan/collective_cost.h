// α–β prices of collectives (nccl-tests definitions, cost-model reference):
//   t = α(op, n) + S · busfactor(op, n) / busbw
// S the whole buffer in bytes (for all-gather/reduce-scatter: count × size × n), busfactor
// 2(n−1)/n for all-reduce, (n−1)/n for all-gather, reduce-scatter and all-to-all (S: one rank's
// whole send buffer), 1 for send/recv.
#pragma once

#include <cstdint>

#include "plan/cluster_spec.h"
#include "plan/layout.h"

namespace lattice::plan {

double bus_factor(CollectiveOp op, int64_t group_size);

// Seconds for one collective of `bytes` over `group_size` ranks whose slowest hop is
// `transport`. 0 for a group of one. With calibration points for (transport, op): the point of
// the nearest group size (α scaled by the ratio of ring steps). Without: the link preset,
// all-reduce taking the cheaper of ring (2(n−1) steps) and tree (2⌈log2 n⌉ steps, full buffer
// over the link twice), as NCCL picks the cheaper algorithm per size.
double collective_seconds(const ClusterSpec& cluster, CollectiveOp op, Transport transport,
                          int64_t group_size, double bytes);

// Which link each group's slowest hop crosses. Mesh order is tp fastest, then dp, then pp
// (DESIGN.md invariant 3), so a tp group is tp consecutive ranks, a dp group spans tp·dp
// consecutive ranks, and pipeline neighbours sit tp·dp ranks apart.
Transport tp_transport(const Layout& layout, int64_t gpus_per_node);
Transport cp_transport(const Layout& layout, int64_t gpus_per_node);
Transport dp_transport(const Layout& layout, int64_t gpus_per_node);
Transport pp_transport(const Layout& layout, int64_t gpus_per_node);
Transport ep_transport(const Layout& layout, int64_t gpus_per_node);

}  // namespace lattice::plan
