// The `mpi` transport: one rank per process on OpenMPI (mpirun, or Slurm's srun), using MPI
// point-to-point for Lattice's own algorithms and MPI's non-blocking collectives for
// Algorithm::kNative. Each group gets its own MPI communicators (one for collectives, one for
// user send/recv), created by its members only (MPI_Comm_create_group).
//
// MPI calls come from two threads of a rank (MPI_THREAD_MULTIPLE): the compute thread (tensor-
// parallel collectives) and the gradient comm thread (data-parallel buckets). Groups are created
// (split, new_group) on the compute thread while the comm thread is idle. Waits poll MPI_Test
// against the deadline, yielding the core between polls.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "comm/launch_env.h"
#include "comm/transport.h"

namespace lattice {

// Ends every process of the MPI job (MPI_Abort on the world) with exit code `code`: the
// launcher kills the other ranks, stopped ones included, so nothing is left hanging.
[[noreturn]] void abort_mpi_job(int code);

class MpiTransport : public Transport {
 public:
  // Initialises MPI (unless already initialised) and checks that MPI's rank and size agree with
  // the launcher's environment. Finalises MPI on destruction if it initialised it.
  static std::shared_ptr<MpiTransport> create();
  ~MpiTransport() override;
  MpiTransport(const MpiTransport&) = delete;
  MpiTransport& operator=(const MpiTransport&) = delete;

  TransportKind kind() const override { return TransportKind::kMpi; }
  int world_rank() const override { return rank_; }
  int world_size() const override { return size_; }
  const std::optional<LaunchEnvironment>& launch() const { return launch_; }

  void create_context(uint64_t context, const std::vector<int>& members) override;
  PendingSendPtr post_send(int peer, MessageKey key, const void* data, size_t bytes) override;
  void recv(int peer, MessageKey key, void* data, size_t bytes, Deadline deadline) override;
  bool has_native() const override { return true; }
  void run_native(uint64_t context, const NativeCall& call, Deadline deadline) override;

 private:
  struct Group;
  MpiTransport();
  const Group& group(uint64_t context) const;
  // MPI communicator, rank within it and tag for a message to or from world rank `peer`.
  struct Route {
    void* comm;  // MPI_Comm, kept opaque so that mpi.h stays out of this header
    int peer;
    int tag;
  };
  Route route(int peer, MessageKey key) const;

  int rank_ = 0;
  int size_ = 1;
  int tag_mask_ = 0x7fff;
  bool owns_mpi_ = false;
  std::optional<LaunchEnvironment> launch_;
  std::map<uint64_t, std::unique_ptr<Group>> groups_;
};

}  // namespace lattice
