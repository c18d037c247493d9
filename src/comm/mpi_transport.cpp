#include "comm/mpi_transport.h"

#include <mpi.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "comm/reduce_kernels.h"

namespace lattice {
namespace {

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  LATTICE_THROW(CommError, "{} failed: {}", what, std::string(text, size_t(len)));
}

// Polls `request` until it completes or the deadline passes; on a missed deadline the request
// is cancelled and PeerTimeout names `peer` (-1 for a native collective).
void wait_request(MPI_Request& request, Deadline deadline, int peer, const char* what,
                  MPI_Status* status = MPI_STATUS_IGNORE) {
  int done = 0;
  for (int polls = 0;; ++polls) {
    check_mpi(MPI_Test(&request, &done, status), what);
    if (done) return;
    if ((polls & 63) == 0 && CommClock::now() > deadline) break;
    std::this_thread::yield();
  }
  MPI_Cancel(&request);
  MPI_Request_free(&request);
  throw PeerTimeout(peer, peer >= 0 ? fmt::format("rank {} did not answer {}", peer, what)
                                    : fmt::format("{} did not complete", what));
}

class MpiPendingSend : public PendingSend {
 public:
  MpiPendingSend(MPI_Request request, int peer) : request_(request), peer_(peer) {}
  ~MpiPendingSend() override {
    if (request_ != MPI_REQUEST_NULL) {
      MPI_Cancel(&request_);
      MPI_Request_free(&request_);
    }
  }
  void wait(Deadline deadline) override { wait_request(request_, deadline, peer_, "send"); }

 private:
  MPI_Request request_;
  int peer_;
};

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return MPI_FLOAT;
    case DType::kI32:
      return MPI_INT32_T;
    default:
      return MPI_UINT16_T;  // bf16 / f16 moved as bits
  }
}

}  // namespace

void abort_mpi_job(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // MPI_Abort does not return; this only satisfies [[noreturn]]
}

struct MpiTransport::Group {
  MPI_Comm collectives = MPI_COMM_NULL;
  MPI_Comm messages = MPI_COMM_NULL;
  std::vector<int> members;  // world ranks in group order
};

std::shared_ptr<MpiTransport> MpiTransport::create() {
  return std::shared_ptr<MpiTransport>(new MpiTransport());
}

MpiTransport::MpiTransport() {
  launch_ = detect_launch_environment();
  int initialized = 0;
  MPI_Initialized(&initialized);
  // A rank calls MPI from two threads at once: tensor-parallel collectives on the compute thread
  // while the data-parallel gradient buckets reduce on the comm thread (parallel/comm_thread.h).
  int provided = 0;
  if (!initialized) {
    check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    owns_mpi_ = true;
  } else {
    MPI_Query_thread(&provided);
  }
  if (provided < MPI_THREAD_MULTIPLE) {
    LATTICE_THROW(CommError,
                  "the MPI library provides thread level {} but Lattice needs MPI_THREAD_MULTIPLE "
                  "({}): gradient reduction runs on its own thread ---> HINT: use an MPI built "
                  "with thread support (OpenMPI: `ompi_info | grep -i thread` must say "
                  "MPI_THREAD_MULTIPLE: yes)",
                  provided, MPI_THREAD_MULTIPLE);
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  if (launch_ && (launch_->rank != rank_ || launch_->size != size_)) {
    LATTICE_THROW(CommError,
                  "the {} launcher says rank {} of {} but MPI says rank {} of {} ---> HINT: launch "
                  "with the mpirun/srun of the MPI library Lattice was built against",
                  launch_->launcher, launch_->rank, launch_->size, rank_, size_);
  }
  void* tag_ub = nullptr;
  int found = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &found);
  if (found) {
    int ub = *static_cast<int*>(tag_ub);
    tag_mask_ = int(std::bit_floor(unsigned(ub) + 1u) - 1u);
  }
}

MpiTransport::~MpiTransport() {
  for (auto& [context, g] : groups_) {
    if (g->collectives != MPI_COMM_NULL) MPI_Comm_free(&g->collectives);
    if (g->messages != MPI_COMM_NULL) MPI_Comm_free(&g->messages);
  }
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owns_mpi_ && !finalized) MPI_Finalize();
}

void MpiTransport::create_context(uint64_t context, const std::vector<int>& members) {
  if (groups_.count(context) != 0) return;
  auto g = std::make_unique<Group>();
  g->members = members;
  MPI_Group world_group, sub_group;
  MPI_Comm_group(MPI_COMM_WORLD, &world_group);
  MPI_Group_incl(world_group, int(members.size()), members.data(), &sub_group);
  // Only the members call this; the tag keeps concurrent creations of different groups apart.
  check_mpi(
      MPI_Comm_create_group(MPI_COMM_WORLD, sub_group, int(context & 0x7fff), &g->collectives),
      "MPI_Comm_create_group");
  MPI_Group_free(&sub_group);
  MPI_Group_free(&world_group);
  MPI_Comm_set_errhandler(g->collectives, MPI_ERRORS_RETURN);
  check_mpi(MPI_Comm_dup(g->collectives, &g->messages), "MPI_Comm_dup");
  groups_[context] = std::move(g);
}

const MpiTransport::Group& MpiTransport::group(uint64_t context) const {
  auto it = groups_.find(context);
  LATTICE_CHECK(it != groups_.end(), "no MPI communicator for group context {:#x}", context);
  return *it->second;
}

MpiTransport::Route MpiTransport::route(int peer, MessageKey key) const {
  const Group& g = group(key.context);
  auto it = std::find(g.members.begin(), g.members.end(), peer);
  LATTICE_CHECK(it != g.members.end(), "rank {} is not in the group", peer);
  const bool collective = (key.tag >> 63) != 0;
  // Collective tags: step and phase (bits 0..15) and the low bits of the sequence number; the
  // group's own communicator and MPI's non-overtaking order keep calls apart.
  uint64_t tag = collective ? ((key.tag & 0xffff) | (((key.tag >> 16) & 0x3fff) << 16)) : key.tag;
  return Route{collective ? g.collectives : g.messages, int(it - g.members.begin()),
               int(tag & uint64_t(tag_mask_))};
}

PendingSendPtr MpiTransport::post_send(int peer, MessageKey key, const void* data, size_t bytes) {
  LATTICE_CHECK_LE(bytes, size_t(INT32_MAX), "messages above 2 GiB are not split yet");
  Route r = route(peer, key);
  MPI_Request request;
  check_mpi(
      MPI_Isend(data, int(bytes), MPI_BYTE, r.peer, r.tag, static_cast<MPI_Comm>(r.comm), &request),
      "MPI_Isend");
  return std::make_unique<MpiPendingSend>(request, peer);
}

void MpiTransport::recv(int peer, MessageKey key, void* data, size_t bytes, Deadline deadline) {
  LATTICE_CHECK_LE(bytes, size_t(INT32_MAX), "messages above 2 GiB are not split yet");
  Route r = route(peer, key);
  MPI_Request request;
  MPI_Status status;
  check_mpi(
      MPI_Irecv(data, int(bytes), MPI_BYTE, r.peer, r.tag, static_cast<MPI_Comm>(r.comm), &request),
      "MPI_Irecv");
  wait_request(request, deadline, peer, "recv", &status);
  int received = 0;
  MPI_Get_count(&status, MPI_BYTE, &received);
  if (size_t(received) != bytes) {
    LATTICE_THROW(CommError,
                  "rank {} sent {} bytes where rank {} expected {} ---> HINT: every rank of a "
                  "collective must pass the same count and dtype",
                  peer, received, rank_, bytes);
  }
}

void MpiTransport::run_native(uint64_t context, const NativeCall& call, Deadline deadline) {
  MPI_Comm comm = group(context).collectives;
  int grank = 0, gsize = 1;
  MPI_Comm_rank(comm, &grank);
  MPI_Comm_size(comm, &gsize);
  const bool reduces = call.collective == Collective::kAllReduce ||
                       call.collective == Collective::kReduceScatter ||
                       call.collective == Collective::kReduce;
  // MPI has no bf16: reductions of bf16 run on an fp32 copy (exact for max, fp32 accumulation
  // for sum), other collectives move bf16 as 16-bit words.
  const bool widen = reduces && call.dtype == DType::kBF16;
  const DType wire = widen ? DType::kF32 : call.dtype;
  const int64_t in_count =
      call.collective == Collective::kReduceScatter ? call.count * gsize : call.count;
  const int64_t out_count =
      call.collective == Collective::kAllGather ? call.count * gsize : call.count;
  std::vector<float> wide_in, wide_out;
  const void* send = call.send;
  void* recv = call.recv;
  if (widen) {
    wide_in.resize(size_t(in_count));
    wide_out.resize(size_t(out_count));
    convert(call.send, call.dtype, wide_in.data(), DType::kF32, in_count);
    send = wide_in.data();
    recv = wide_out.data();
  }
  LATTICE_CHECK_LE(std::max(in_count, out_count), int64_t(INT32_MAX));
  const MPI_Datatype type = mpi_type(wire);
  const MPI_Op op = call.op == ReduceOp::kSum ? MPI_SUM : MPI_MAX;
  const int count = int(call.count);
  MPI_Request request;
  int rc = MPI_SUCCESS;
  switch (call.collective) {
    case Collective::kAllReduce:
      rc = widen ? MPI_Iallreduce(send, recv, count, type, op, comm, &request)
                 : MPI_Iallreduce(MPI_IN_PLACE, recv, count, type, op, comm, &request);
      break;
    case Collective::kReduceScatter:
      rc = MPI_Ireduce_scatter_block(send, recv, count, type, op, comm, &request);
      break;
    case Collective::kAllGather: {
      const auto* own =
          static_cast<const std::byte*>(recv) + size_t(grank) * size_t(count) * dtype_size(wire);
      rc = MPI_Iallgather(send == own ? MPI_IN_PLACE : send, count, type, recv, count, type, comm,
                          &request);
      break;
    }
    case Collective::kBroadcast:
      rc = MPI_Ibcast(recv, count, type, call.root, comm, &request);
      break;
    case Collective::kReduce:
      if (!widen && send == recv) {
        rc = grank == call.root
                 ? MPI_Ireduce(MPI_IN_PLACE, recv, count, type, op, call.root, comm, &request)
                 : MPI_Ireduce(send, nullptr, count, type, op, call.root, comm, &request);
      } else {
        rc = MPI_Ireduce(send, recv, count, type, op, call.root, comm, &request);
      }
      break;
    case Collective::kBarrier:
      rc = MPI_Ibarrier(comm, &request);
      break;
    default:
      LATTICE_CHECK(false, "{} has no native form", collective_name(call.collective));
  }
  check_mpi(rc, "native collective");
  wait_request(request, deadline, -1, "the MPI collective");
  if (widen && (call.collective != Collective::kReduce || grank == call.root)) {
    convert(wide_out.data(), DType::kF32, call.recv, call.dtype, out_count);
  }
}

}  // namespace lattice
