// Vocabulary shared by every part of comm/: what a collective does (Collective, ReduceOp), how
// (Algorithm), and the per-call options (CollectiveOptions, after Gloo's AllreduceOptions).
#pragma once

#include <chrono>
#include <cstdint>
#include <string_view>

namespace lattice {

enum class ReduceOp : uint8_t { kSum, kMax };

enum class Collective : uint8_t {
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kReduce,
  kBarrier,
  kSend,
  kRecv,
  // Every rank sends block j of its input to rank j and receives block i of rank i's; blocks
  // may differ in length per peer (MPI_Alltoallv): expert parallelism's dispatch and combine.
  kAllToAll,
};
inline constexpr int kCollectiveCount = 9;

// kAuto asks the tuner (tuner.h) for the cheapest algorithm at the call's size. kTree is a
// binomial tree (depth ceil(log2 n), latency-bound sizes); kHalvingDoubling is Rabenseifner's
// recursive halving (reduce-scatter) and doubling (all-gather) with the MPICH fix-up for group
// sizes that are not a power of two; kNative is the MPI library's own collective (mpi only);
// kPairwise is all_to_all's only algorithm: at step s rank r sends to r + s and receives from
// r - s, n - 1 steps with one message each way.
enum class Algorithm : uint8_t { kAuto, kRing, kHalvingDoubling, kTree, kNative, kPairwise };
inline constexpr int kAlgorithmCount = 6;

// kThreads: in-process ranks; kMpi: one rank per process under mpirun / srun; kGloo: one rank per
// process under `lattice launch`, on Gloo's TCP point-to-point (gloo_transport.h).
enum class TransportKind : uint8_t { kThreads, kMpi, kGloo };
inline constexpr int kTransportCount = 3;

std::string_view reduce_op_name(ReduceOp op);          // "sum", "max"
std::string_view collective_name(Collective c);        // "all_reduce", ...
std::string_view algorithm_name(Algorithm a);          // "auto", "ring", "hd", "tree", "native"
std::string_view transport_name(TransportKind kind);   // "threads", "mpi", "gloo"
Algorithm parse_algorithm(std::string_view name);      // throws ValueError naming the choices
TransportKind parse_transport(std::string_view name);  // throws ConfigError naming the choices

using CommClock = std::chrono::steady_clock;
using Deadline = CommClock::time_point;

// Per-call options. Every rank of the group passes the same values.
struct CollectiveOptions {
  // Separates concurrent traffic: a collective only matches peers' messages with the same tag;
  // for send/recv the tag pairs a send with its recv.
  uint32_t tag = 0;
  // Deadline for the whole call; zero means the communicator's default (CommConfig).
  std::chrono::milliseconds timeout{0};
  // kAuto lets the tuner choose; anything else forces that algorithm.
  Algorithm algorithm = Algorithm::kAuto;
};

}  // namespace lattice
