#include "data/token_loader.h"

#include "core/error.h"
#include "data/window_order.h"

namespace lattice {

namespace {

// A straddling batch needs at most two epochs' orders; keep one more for the next batch.
constexpr size_t kCachedOrders = 3;

}  // namespace

TokenLoader::TokenLoader(std::shared_ptr<const TokenFile> file, TokenLoaderConfig config)
    : file_(std::move(file)), config_(config) {
  LATTICE_CHECK(file_ != nullptr, "TokenLoader needs a token file");
  if (config_.batch_size < 1 || config_.seq_len < 1) {
    LATTICE_THROW(ConfigError, "token loader: batch size {} and sequence length {} must be >= 1",
                  config_.batch_size, config_.seq_len);
  }
  const int64_t tokens = file_->size();
  if (tokens < config_.seq_len + 1) {
    LATTICE_THROW(ValueError,
                  "token file '{}' holds {} tokens, fewer than one window of seq_len + 1 = {} "
                  "---> HINT: use a shorter sequence length or a larger file (or a larger "
                  "--val-fraction for val.bin)",
                  file_->path().string(), tokens, config_.seq_len + 1);
  }
  windows_ = (tokens - 1) / config_.seq_len;
}

int64_t TokenLoader::window_start(int64_t sequence) const {
  LATTICE_CHECK_GE(sequence, 0);
  return window_of(sequence / windows_, sequence % windows_) * config_.seq_len;
}

int64_t TokenLoader::window_of(int64_t epoch, int64_t index) const {
  if (config_.mode == SamplingMode::kSequential) return index;
  return int64_t((*order_of_epoch(epoch))[size_t(index)]);
}

std::shared_ptr<const std::vector<uint32_t>> TokenLoader::order_of_epoch(int64_t epoch) const {
  std::lock_guard<std::mutex> lock(order_mutex_);
  auto it = orders_.find(epoch);
  if (it != orders_.end()) return it->second;
  auto order = std::make_shared<const std::vector<uint32_t>>(
      shuffled_window_order(config_.seed, epoch, windows_));
  orders_.emplace(epoch, order);
  // Evict the epoch farthest from the one just needed.
  while (orders_.size() > kCachedOrders) {
    auto first = orders_.begin();
    auto last = std::prev(orders_.end());
    orders_.erase(epoch - first->first >= last->first - epoch ? first : last);
  }
  return order;
}

void TokenLoader::read_batch_rows(int64_t batch, int64_t row_begin, int64_t row_end,
                                  const Tensor& inputs, const Tensor& targets) const {
  if (batch < 0) {
    LATTICE_THROW(ValueError, "token loader: global batch {} is negative", batch);
  }
  read_rows(batch * config_.batch_size, row_begin, row_end, inputs, targets);
}

void TokenLoader::read_rows(int64_t first_sequence, int64_t row_begin, int64_t row_end,
                            const Tensor& inputs, const Tensor& targets) const {
  const int64_t T = config_.seq_len;
  if (row_begin < 0 || row_end < row_begin || row_end > config_.batch_size) {
    LATTICE_THROW(ShapeError, "token loader: rows [{}, {}) are not inside a batch of B = {}",
                  row_begin, row_end, config_.batch_size);
  }
  const Shape shape{row_end - row_begin, T};
  expect_dtype(inputs, DType::kI32, "TokenLoader", "inputs");
  expect_dtype(targets, DType::kI32, "TokenLoader", "targets");
  expect_shape(inputs, shape, "TokenLoader", "inputs");
  expect_shape(targets, shape, "TokenLoader", "targets");

  const uint16_t* tokens = file_->tokens().data();
  int32_t* in = inputs.data<int32_t>();
  int32_t* out = targets.data<int32_t>();
  // Shuffled mode looks the epoch's order up once per epoch, not once per row.
  std::shared_ptr<const std::vector<uint32_t>> order;
  int64_t order_epoch = -1;
  for (int64_t row = row_begin; row < row_end; ++row) {
    const int64_t sequence = first_sequence + row;
    const int64_t epoch = sequence / windows_;
    const int64_t index = sequence % windows_;
    int64_t window_index = index;
    if (config_.mode == SamplingMode::kShuffled) {
      if (epoch != order_epoch) order = order_of_epoch(order_epoch = epoch);
      window_index = int64_t((*order)[size_t(index)]);
    }
    // window (T + 1 tokens): inputs = window[0, T), targets = window[1, T + 1)
    const uint16_t* window = tokens + window_index * T;
    int32_t* in_row = in + (row - row_begin) * T;
    int32_t* out_row = out + (row - row_begin) * T;
    for (int64_t t = 0; t < T; ++t) {
      in_row[t] = window[t];
      out_row[t] = window[t + 1];
    }
  }
}

DataPosition TokenLoader::position() const {
  return DataPosition{config_.mode, config_.seed, next_sequence_ / windows_,
                      next_sequence_ % windows_};
}

void TokenLoader::seek(const DataPosition& position) {
  if (position.mode != config_.mode ||
      (config_.mode == SamplingMode::kShuffled && position.seed != config_.seed)) {
    LATTICE_THROW(ConfigError,
                  "cannot resume '{}': the saved data position is {} (seed {}) but the loader "
                  "is {} (seed {}) ---> HINT: resume with the sampling mode and seed of the run "
                  "that saved it",
                  file_->path().string(), sampling_mode_name(position.mode), position.seed,
                  sampling_mode_name(config_.mode), config_.seed);
  }
  if (position.epoch < 0 || position.index < 0 || position.index >= windows_) {
    LATTICE_THROW(ConfigError,
                  "cannot resume '{}' at epoch {} index {}: an epoch has {} windows of {} tokens "
                  "---> HINT: the token file or the sequence length changed since the save",
                  file_->path().string(), position.epoch, position.index, windows_,
                  config_.seq_len);
  }
  next_sequence_ = position.epoch * windows_ + position.index;
}

void TokenLoader::read_current_rows(int64_t row_begin, int64_t row_end, const Tensor& inputs,
                                    const Tensor& targets) const {
  read_rows(next_sequence_, row_begin, row_end, inputs, targets);
}

void TokenLoader::next(const Tensor& inputs, const Tensor& targets) {
  read_current_rows(0, config_.batch_size, inputs, targets);
  advance();
}

TokenBatch make_token_batch(Arena& arena, int64_t rows, int64_t seq_len) {
  return TokenBatch{Tensor::empty(arena, Shape{rows, seq_len}, DType::kI32),
                    Tensor::empty(arena, Shape{rows, seq_len}, DType::kI32)};
}

}  // namespace lattice
