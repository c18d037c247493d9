#include "plan/collective_cost.h"

#include <cmath>
#include <limits>

namespace lattice::plan {
namespace {

// Latency steps of the ring algorithm (send/recv: one message).
double ring_steps(CollectiveOp op, int64_t n) {
  switch (op) {
    case CollectiveOp::kAllReduce:
      return 2.0 * double(n - 1);
    case CollectiveOp::kAllGather:
    case CollectiveOp::kReduceScatter:
    case CollectiveOp::kAllToAll:
      return double(n - 1);
    case CollectiveOp::kSendRecv:
      return 1.0;
  }
  return 1.0;
}

const CollectivePoint* nearest_point(const ClusterSpec& cluster, CollectiveOp op,
                                     Transport transport, int64_t n) {
  const CollectivePoint* nearest = nullptr;
  double best = std::numeric_limits<double>::infinity();
  for (const CollectivePoint& p : cluster.collectives) {
    if (p.op != op || p.transport != transport) continue;
    double distance = std::abs(std::log2(double(n) / double(p.group_size)));
    if (distance < best) best = distance, nearest = &p;
  }
  return nearest;
}

}  // namespace

double bus_factor(CollectiveOp op, int64_t n) {
  switch (op) {
    case CollectiveOp::kAllReduce:
      return 2.0 * double(n - 1) / double(n);
    case CollectiveOp::kAllGather:
    case CollectiveOp::kReduceScatter:
    case CollectiveOp::kAllToAll:  // the own block stays
      return double(n - 1) / double(n);
    case CollectiveOp::kSendRecv:
      return 1.0;
  }
  return 1.0;
}

double collective_seconds(const ClusterSpec& cluster, CollectiveOp op, Transport transport,
                          int64_t n, double bytes) {
  if (op != CollectiveOp::kSendRecv && n <= 1) return 0.0;
  if (op == CollectiveOp::kSendRecv) n = 2;
  if (const CollectivePoint* p = nearest_point(cluster, op, transport, n)) {
    double alpha = p->alpha_s * ring_steps(op, n) / ring_steps(op, p->group_size);
    return alpha + bytes * bus_factor(op, n) / p->bus_bytes_per_s;
  }
  const LinkSpec& link = cluster.link(transport);
  const double bandwidth =
      link.peak_bytes_per_s * link.achievable *
      (link.half_bandwidth_bytes > 0 && bytes > 0 ? bytes / (bytes + link.half_bandwidth_bytes)
                                                  : 1.0);
  double ring = link.alpha_s * ring_steps(op, n) + bytes * bus_factor(op, n) / bandwidth;
  if (op != CollectiveOp::kAllReduce) return ring;
  double tree = link.alpha_s * 2.0 * std::ceil(std::log2(double(n))) + bytes * 2.0 / bandwidth;
  return std::min(ring, tree);
}

Transport tp_transport(const Layout& l, int64_t gpus_per_node) {
  return l.tp > gpus_per_node ? Transport::kInterNode : Transport::kIntraNode;
}
// Mesh order tp, cp, dp, pp: a group spans its own axis and every faster one.
Transport cp_transport(const Layout& l, int64_t gpus_per_node) {
  return l.tp * l.cp > gpus_per_node ? Transport::kInterNode : Transport::kIntraNode;
}
Transport dp_transport(const Layout& l, int64_t gpus_per_node) {
  return l.tp * l.cp * l.dp > gpus_per_node ? Transport::kInterNode : Transport::kIntraNode;
}
// An ep group: ep consecutive dp ranks; the ranks holding the same experts span the dp group.
Transport ep_transport(const Layout& l, int64_t gpus_per_node) {
  return l.tp * l.cp * l.ep > gpus_per_node ? Transport::kInterNode : Transport::kIntraNode;
}
Transport pp_transport(const Layout& l, int64_t gpus_per_node) {
  return l.tp * l.cp * l.dp * l.pp > gpus_per_node ? Transport::kInterNode : Transport::kIntraNode;
}

}  // namespace lattice::plan
