#include "comm/transport.h"

namespace lattice {

void Transport::run_native(uint64_t context, const NativeCall& call, Deadline deadline) {
  LATTICE_THROW(ValueError,
                "{}: algorithm 'native' needs the mpi transport, this is '{}' ---> HINT: use "
                "ring, hd, tree or auto",
                collective_name(call.collective), transport_name(kind()));
}

}  // namespace lattice
