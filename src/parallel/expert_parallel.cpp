#include "parallel/expert_parallel.h"

#include "core/error.h"
#include "core/timer.h"

namespace lattice {

ExpertParallel::ExpertParallel(Communicator* group) : group_(group) {}

std::vector<int64_t> ExpertParallel::exchange_counts(const std::vector<int64_t>& rows_per_expert,
                                                     std::vector<int64_t>& send_rows,
                                                     std::vector<int64_t>& recv_rows) {
  const int n = size();
  const int64_t E = int64_t(rows_per_expert.size()), local = E / n;
  LATTICE_CHECK(E % n == 0, "{} experts over {} ranks", E, n);
  send_rows.assign(size_t(n), 0);
  for (int64_t e = 0; e < E; ++e) send_rows[size_t(e / local)] += rows_per_expert[size_t(e)];
  std::vector<int32_t> counts(rows_per_expert.begin(), rows_per_expert.end());
  std::vector<int32_t> received(size_t(n * local));
  const std::vector<int64_t> per_peer(size_t(n), local);
  if (n == 1) {
    received = counts;
  } else {
    group_->all_to_all(counts.data(), per_peer, received.data(), per_peer, DType::kI32);
  }
  std::vector<int64_t> out(received.begin(), received.end());
  recv_rows.assign(size_t(n), 0);
  for (int i = 0; i < n; ++i) {
    for (int64_t le = 0; le < local; ++le) recv_rows[size_t(i)] += out[size_t(i * local + le)];
  }
  return out;
}

void ExpertParallel::exchange_rows(const void* send, const std::vector<int64_t>& send_rows,
                                   void* recv, const std::vector<int64_t>& recv_rows,
                                   int64_t row_elements, DType dtype) {
  std::vector<int64_t> send_counts, recv_counts;
  int64_t sent = 0;
  for (int64_t r : send_rows) {
    send_counts.push_back(r * row_elements);
    sent += r * row_elements;
  }
  for (int64_t r : recv_rows) recv_counts.push_back(r * row_elements);
  Stopwatch watch;
  group_->all_to_all(send, send_counts, recv, recv_counts, dtype);
  ++stats_.exchanges;
  stats_.bytes += sent * int64_t(dtype_size(dtype));
  stats_.seconds += watch.seconds();
}

}  // namespace lattice
