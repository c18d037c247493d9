// The ZeRO-2/3 side of a whole-model forward and backward (model/parameter_hooks.h), driven by
// ShardedGradients: ZeRO-3 gathers each unit's parameters just before it runs (prefetching the next
// one) and frees them after; ZeRO-2 and 3 lend the gradient buckets of a unit before its backward.
#pragma once

#include <cstdint>

#include "model/parameter_hooks.h"

namespace lattice {

class GatheredParameters;
class ShardedGradients;

class ZeroHooks : public ParameterHooks {
 public:
  // gathered: nullptr under ZeRO-2; layers: the model's layer count.
  ZeroHooks(ShardedGradients& gradients, GatheredParameters* gathered, int64_t layers)
      : gradients_(gradients), gathered_(gathered), layers_(layers) {}

  void before_forward(int64_t unit) override;
  void after_forward(int64_t unit) override;
  void before_backward(int64_t unit) override;
  void after_backward(int64_t unit) override;

 private:
  ShardedGradients& gradients_;
  GatheredParameters* gathered_;
  int64_t layers_;
};

}  // namespace lattice
