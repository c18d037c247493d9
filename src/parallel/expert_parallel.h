// Expert parallelism (docs/moe.md): a sparse layer's E experts spread over the ep ranks of a
// group, rank j holding experts [j·E/ep, (j+1)·E/ep). Each rank routes its own tokens, sends
// every expert's rows to the rank holding it and gets the outputs back: two all-to-alls
// forward (dispatch, combine) and two backward, with the same counts reversed.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.h"

namespace lattice {

// Which experts a rank holds: `size` ranks share each layer's experts, this is rank `rank`.
struct ExpertLayout {
  int size = 1;
  int rank = 0;
  int64_t first(int64_t experts) const { return experts / size * rank; }
  int64_t count(int64_t experts) const { return experts / size; }
};

struct ExpertParallelStats {
  int64_t exchanges = 0;  // all-to-alls of rows
  int64_t bytes = 0;      // sent, this rank's own block included
  double seconds = 0.0;
};

class ExpertParallel {
 public:
  ExpertParallel() = default;  // every rank holds every expert: nothing is exchanged
  explicit ExpertParallel(Communicator* group);

  int size() const { return group_ == nullptr ? 1 : group_->size(); }
  int rank() const { return group_ == nullptr ? 0 : group_->rank(); }
  Communicator* group() const { return group_; }
  ExpertLayout layout() const { return {size(), rank()}; }

  // rows_per_expert: this rank's packed rows for each of the E experts (expert-major). Returns
  // the rows every rank sends this one for each of its local experts, (size × E / size),
  // source-major, and fills what this rank sends each peer (`send_rows`) and receives from
  // each (`recv_rows`). Collective.
  std::vector<int64_t> exchange_counts(const std::vector<int64_t>& rows_per_expert,
                                       std::vector<int64_t>& send_rows,
                                       std::vector<int64_t>& recv_rows);
  // Rows of `row_elements` elements: block j of `send` (send_rows[j] rows) to rank j, block i of
  // `recv` from rank i. Collective.
  void exchange_rows(const void* send, const std::vector<int64_t>& send_rows, void* recv,
                     const std::vector<int64_t>& recv_rows, int64_t row_elements, DType dtype);

  const ExpertParallelStats& stats() const { return stats_; }

 private:
  Communicator* group_ = nullptr;
  ExpertParallelStats stats_;
};

}  // namespace lattice
