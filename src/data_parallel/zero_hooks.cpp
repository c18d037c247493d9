#include "data_parallel/zero_hooks.h"

#include "data_parallel/gathered_parameters.h"
#include "data_parallel/sharded_gradients.h"

namespace lattice {

// Forward runs the ends (embedding), layers 0 .. L-1, the ends (head); backward the reverse.
void ZeroHooks::before_forward(int64_t unit) {
  if (gathered_ == nullptr) return;
  gathered_->gather(unit);
  const int64_t next = unit == kEnds ? 0 : unit + 1;
  if (next < layers_) gathered_->prefetch(next);
}

void ZeroHooks::after_forward(int64_t unit) {
  if (gathered_ != nullptr && unit != kEnds) gathered_->release(unit);
}

void ZeroHooks::before_backward(int64_t unit) {
  if (gathered_ != nullptr) {
    gathered_->gather(unit);
    const int64_t next = unit == kEnds ? layers_ - 1 : unit - 1;
    if (next >= 0) gathered_->prefetch(next);
  }
  gradients_.lend(unit);
}

void ZeroHooks::after_backward(int64_t unit) {
  if (gathered_ != nullptr) gathered_->release(unit);
}

}  // namespace lattice
