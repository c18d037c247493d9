// Batches of token windows from a token file, deterministic and resumable.
//
// The file's N tokens hold W = floor((N - 1) / T) windows: window w is the T + 1 tokens starting
// at token w·T (inputs are its first T tokens, targets its last T, i.e. the next-token shift).
// The up to T - 1 tokens after the last whole window are never read. The loader hands out an
// endless stream of windows, epoch after epoch of W windows each; sequence s of the stream
// (s = 0, 1, ...) is position p = s mod W of epoch e = s div W:
//
//   sequential: the window is p, so sequence s starts at token (s mod W)·T. Global batch k is
//               sequences [k·B, (k + 1)·B): row b starts at token (k·B + b)·T until the end of
//               the file, where the stream wraps around to window 0 (llm.c also restarts at the
//               beginning, but drops a partial last batch; here batches may straddle the wrap).
//   shuffled:   the window is order_e[p], where order_e = shuffled_window_order(seed, e) is a
//               permutation of [0, W) that depends only on (seed, e).
//
// A global batch is a pure function of (file, mode, seed, B, T, k) (DESIGN.md invariant 1), so
// any split over data-parallel ranks and micro-batches reads the same tokens: rows [r0, r1) of
// batch k equal those rows of the whole batch. The cursor (position/seek/advance) is for runs
// that save and resume; its DataPosition counts windows, not batches.
//
// Const methods are safe to call from several threads (the shuffle cache is locked).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "core/tensor.h"
#include "data/data_position.h"
#include "data/token_file.h"

namespace lattice {

struct TokenLoaderConfig {
  SamplingMode mode = SamplingMode::kSequential;
  uint64_t seed = 0;       // used by shuffled mode
  int64_t batch_size = 0;  // B: sequences in a global batch
  int64_t seq_len = 0;     // T: tokens per sequence
};

class TokenLoader {
 public:
  // Throws ConfigError for B or T < 1 and ValueError if the file holds no whole window.
  TokenLoader(std::shared_ptr<const TokenFile> file, TokenLoaderConfig config);

  const TokenLoaderConfig& config() const { return config_; }
  const TokenFile& file() const { return *file_; }
  int64_t windows_per_epoch() const { return windows_; }  // W
  // The first token of the window read by sequence `sequence` of the stream.
  int64_t window_start(int64_t sequence) const;

  // Rows [row_begin, row_end) of global batch `batch`: inputs and targets are i32 tensors of
  // shape (row_end - row_begin, T), preallocated by the caller (e.g. with make_token_batch).
  void read_batch_rows(int64_t batch, int64_t row_begin, int64_t row_end, const Tensor& inputs,
                       const Tensor& targets) const;
  void read_batch(int64_t batch, const Tensor& inputs, const Tensor& targets) const {
    read_batch_rows(batch, 0, config_.batch_size, inputs, targets);
  }
  // Rows [row_begin, row_end) of the B sequences starting at sequence `first_sequence` of the
  // stream (a resumed run whose batch starts elsewhere than batch·B).
  void read_rows(int64_t first_sequence, int64_t row_begin, int64_t row_end, const Tensor& inputs,
                 const Tensor& targets) const;

  // The cursor: the batch at the cursor is the B sequences starting at sequence
  // epoch·W + index of position(). A fresh loader's cursor is at global batch 0; after k
  // advances it is at global batch k.
  DataPosition position() const;
  // Moves the cursor. Throws ConfigError if the position was saved under another mode or seed,
  // or its index is not inside an epoch of this file.
  void seek(const DataPosition& position);
  // Rows [row_begin, row_end) of the batch at the cursor (shapes as read_batch_rows).
  void read_current_rows(int64_t row_begin, int64_t row_end, const Tensor& inputs,
                         const Tensor& targets) const;
  void advance() { next_sequence_ += config_.batch_size; }
  // read_current_rows(0, B, ...) then advance().
  void next(const Tensor& inputs, const Tensor& targets);

 private:
  int64_t window_of(int64_t epoch, int64_t index) const;
  std::shared_ptr<const std::vector<uint32_t>> order_of_epoch(int64_t epoch) const;

  std::shared_ptr<const TokenFile> file_;
  TokenLoaderConfig config_;
  int64_t windows_ = 0;
  int64_t next_sequence_ = 0;
  // Shuffled mode: the permutations of the last epochs used (a batch may straddle two).
  mutable std::mutex order_mutex_;
  mutable std::map<int64_t, std::shared_ptr<const std::vector<uint32_t>>> orders_;
};

// A (rows, T) pair of i32 tensors for one batch or slice of one, from `arena`.
struct TokenBatch {
  Tensor inputs;
  Tensor targets;
};
TokenBatch make_token_batch(Arena& arena, int64_t rows, int64_t seq_len);

}  // namespace lattice
