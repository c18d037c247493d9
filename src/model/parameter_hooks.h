// What the transformer tells the owner of its parameters around each use of them, so that ZeRO-3
// can gather a layer's parameters just before it runs and free them right after, and ZeRO-2/3
// can lend gradient buffers for a backward (data_parallel/zero_hooks.h).
//
// A "unit" is one transformer layer, or kEnds: the embedding and the head (final norm, output
// layer), which share the tied token table and so are used at both ends of a step. Forward
// calls before_forward(kEnds), then before/after_forward(l) for every layer; backward calls
// before_backward(kEnds) first, before/after_backward(l) for every layer in reverse, and
// after_backward(kEnds) last. kEnds is never released by a forward: the caller releases what a
// forward-only pass (evaluation) left gathered.
#pragma once

#include <cstdint>

namespace lattice {

class ParameterHooks {
 public:
  static constexpr int64_t kEnds = -1;

  virtual ~ParameterHooks() = default;
  virtual void before_forward(int64_t unit) = 0;
  virtual void after_forward(int64_t unit) = 0;
  virtual void before_backward(int64_t unit) = 0;
  virtual void after_backward(int64_t unit) = 0;
};

}  // namespace lattice
