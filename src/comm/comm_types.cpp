#include "comm/comm_types.h"

#include "core/error.h"

namespace lattice {

std::string_view reduce_op_name(ReduceOp op) {
  return op == ReduceOp::kSum ? "sum" : "max";
}

std::string_view collective_name(Collective c) {
  switch (c) {
    case Collective::kAllReduce:
      return "all_reduce";
    case Collective::kReduceScatter:
      return "reduce_scatter";
    case Collective::kAllGather:
      return "all_gather";
    case Collective::kBroadcast:
      return "broadcast";
    case Collective::kReduce:
      return "reduce";
    case Collective::kBarrier:
      return "barrier";
    case Collective::kSend:
      return "send";
    case Collective::kRecv:
      return "recv";
    case Collective::kAllToAll:
      return "all_to_all";
  }
  return "?";
}

std::string_view algorithm_name(Algorithm a) {
  switch (a) {
    case Algorithm::kAuto:
      return "auto";
    case Algorithm::kRing:
      return "ring";
    case Algorithm::kHalvingDoubling:
      return "hd";
    case Algorithm::kTree:
      return "tree";
    case Algorithm::kNative:
      return "native";
    case Algorithm::kPairwise:
      return "pairwise";
  }
  return "?";
}

std::string_view transport_name(TransportKind kind) {
  switch (kind) {
    case TransportKind::kThreads:
      return "threads";
    case TransportKind::kMpi:
      return "mpi";
    case TransportKind::kGloo:
      return "gloo";
  }
  return "?";
}

Algorithm parse_algorithm(std::string_view name) {
  for (int i = 0; i < kAlgorithmCount; ++i) {
    if (algorithm_name(Algorithm(i)) == name) return Algorithm(i);
  }
  LATTICE_THROW(ValueError,
                "unknown algorithm '{}' ---> HINT: use auto, ring, hd, tree, native or pairwise",
                name);
}

TransportKind parse_transport(std::string_view name) {
  for (int i = 0; i < kTransportCount; ++i) {
    if (transport_name(TransportKind(i)) == name) return TransportKind(i);
  }
  // A ConfigError wherever the name comes from (parallel.transport, --transport): input refused.
  LATTICE_THROW(ConfigError,
                "unknown transport '{}' ---> HINT: use threads, mpi or gloo: threads (in-process "
                "ranks), mpi (one rank per process, under mpirun), gloo (one rank per process, "
                "under lattice launch)",
                name);
}

}  // namespace lattice
