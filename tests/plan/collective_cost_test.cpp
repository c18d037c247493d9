#include "plan/collective_cost.h"

#include <gtest/gtest.h>

namespace lattice::plan {
namespace {

TEST(CollectiveCost, BusFactorsAreNcclTests) {
  EXPECT_DOUBLE_EQ(bus_factor(CollectiveOp::kAllReduce, 8), 2.0 * 7 / 8);
  EXPECT_DOUBLE_EQ(bus_factor(CollectiveOp::kAllGather, 8), 7.0 / 8);
  EXPECT_DOUBLE_EQ(bus_factor(CollectiveOp::kReduceScatter, 4), 3.0 / 4);
  EXPECT_DOUBLE_EQ(bus_factor(CollectiveOp::kSendRecv, 2), 1.0);
}

// The bus bandwidth a buffer of `bytes` reaches on `link`: its plateau × S / (S + half).
double at_size(const LinkSpec& link, double bytes) {
  return link.peak_bytes_per_s * link.achievable * bytes / (bytes + link.half_bandwidth_bytes);
}

TEST(CollectiveCost, LargeAllReduceIsRingAlphaBeta) {
  const ClusterSpec c = cluster_preset("dgx-h100");
  const double bytes = 1e9, busbw = at_size(c.intra_node, bytes);
  EXPECT_DOUBLE_EQ(collective_seconds(c, CollectiveOp::kAllReduce, Transport::kIntraNode, 8, bytes),
                   14 * 1e-6 + bytes * 2 * 7 / 8 / busbw);
  EXPECT_DOUBLE_EQ(
      collective_seconds(c, CollectiveOp::kAllGather, Transport::kInterNode, 64, bytes),
      63 * 4e-6 + bytes * 63 / 64 / at_size(c.inter_node, bytes));
  EXPECT_EQ(collective_seconds(c, CollectiveOp::kAllReduce, Transport::kIntraNode, 1, bytes), 0.0);
}

TEST(CollectiveCost, SmallAllReduceAcrossManyNodesTakesTheTree) {
  const ClusterSpec c = cluster_preset("dgx-h100");
  const double bytes = 1024, busbw = at_size(c.inter_node, bytes);
  // Ring: 2·1023 latency steps; tree: 2·log2(1024) = 20.
  EXPECT_DOUBLE_EQ(
      collective_seconds(c, CollectiveOp::kAllReduce, Transport::kInterNode, 1024, bytes),
      20 * 4e-6 + 2 * bytes / busbw);
}

TEST(CollectiveCost, CalibratedPointsReplaceTheLinkPreset) {
  ClusterSpec c = cluster_preset("dgx-a100");
  c.collectives.push_back({.transport = Transport::kIntraNode,
                           .op = CollectiveOp::kAllReduce,
                           .group_size = 8,
                           .alpha_s = 20e-6,
                           .bus_bytes_per_s = 100e9});
  EXPECT_DOUBLE_EQ(collective_seconds(c, CollectiveOp::kAllReduce, Transport::kIntraNode, 8, 1e9),
                   20e-6 + 1e9 * 2 * 7 / 8 / 100e9);
  // Group of 4: nearest point (8), latency scaled by ring steps 6/14.
  EXPECT_DOUBLE_EQ(collective_seconds(c, CollectiveOp::kAllReduce, Transport::kIntraNode, 4, 1e9),
                   20e-6 * 6 / 14 + 1e9 * 2 * 3 / 4 / 100e9);
  // Other operations and transports still use the preset.
  EXPECT_DOUBLE_EQ(collective_seconds(c, CollectiveOp::kAllGather, Transport::kIntraNode, 8, 1e9),
                   7 * 1e-6 + 1e9 * 7 / 8 / at_size(c.intra_node, 1e9));
}

TEST(CollectiveCost, AMidSizedBufferRunsBelowThePlateau) {
  // A tensor-parallel all-reduce of b·s·h (1 × 2048 × 12288 × 2 B, 48 MiB) on 8 A100s: the link's
  // half-bandwidth size (8 MiB) puts it at 6/7 of the plateau; without it, at the plateau.
  ClusterSpec c = cluster_preset("dgx-a100");
  const double bytes = 48.0 * 1024 * 1024, plateau = 300e9 * 0.78;
  const double at =
      collective_seconds(c, CollectiveOp::kAllReduce, Transport::kIntraNode, 8, bytes);
  EXPECT_DOUBLE_EQ(at, 14 * 1e-6 + bytes * 2 * 7 / 8 / (plateau * 6.0 / 7.0));
  c.intra_node.half_bandwidth_bytes = 0;
  EXPECT_DOUBLE_EQ(collective_seconds(c, CollectiveOp::kAllReduce, Transport::kIntraNode, 8, bytes),
                   14 * 1e-6 + bytes * 2 * 7 / 8 / plateau);
}

TEST(CollectiveCost, MeshOrderDecidesWhichLinkAGroupCrosses) {
  // 8 devices per node; mesh order tp, dp, pp.
  EXPECT_EQ(tp_transport({.dp = 16, .tp = 8, .pp = 8}, 8), Transport::kIntraNode);
  EXPECT_EQ(tp_transport({.dp = 8, .tp = 16, .pp = 8}, 8), Transport::kInterNode);
  EXPECT_EQ(dp_transport({.dp = 2, .tp = 4, .pp = 8}, 8), Transport::kIntraNode);
  EXPECT_EQ(dp_transport({.dp = 4, .tp = 4, .pp = 8}, 8), Transport::kInterNode);
  EXPECT_EQ(pp_transport({.dp = 1, .tp = 2, .pp = 4}, 8), Transport::kIntraNode);
  EXPECT_EQ(pp_transport({.dp = 1, .tp = 8, .pp = 2}, 8), Transport::kInterNode);
}

}  // namespace
}  // namespace lattice::plan
