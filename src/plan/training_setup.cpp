#include "plan/training_setup.h"

#include "core/error.h"

namespace lattice::plan {

std::string_view runtime_name(Runtime runtime) {
  return runtime == Runtime::kMegatron ? "megatron" : "lattice";
}

void validate(const TrainingSetup& setup) {
  validate(setup.model);
  if (setup.devices <= 0) {
    LATTICE_THROW(ConfigError,
                  "devices must be positive, got {} ---> HINT: pass --nodes (or "
                  "--gpus)",
                  setup.devices);
  }
  if (setup.global_batch <= 0) {
    LATTICE_THROW(ConfigError,
                  "global batch must be positive, got {} ---> HINT: pass "
                  "--global-batch in sequences",
                  setup.global_batch);
  }
  if (!(setup.memory_headroom >= 0 && setup.memory_headroom < 1)) {
    LATTICE_THROW(ConfigError,
                  "memory headroom {}% must lie in [0, 100) ---> HINT: --headroom 10% keeps a "
                  "tenth of each device free",
                  setup.memory_headroom * 100);
  }
  if (setup.seq_len <= 0) {
    LATTICE_THROW(ConfigError, "sequence length must be positive, got {} ---> HINT: pass --seq",
                  setup.seq_len);
  }
  if (setup.model.position == PositionKind::kLearned && setup.seq_len > setup.model.max_seq_len) {
    LATTICE_THROW(ConfigError,
                  "sequence length {} exceeds model '{}''s {} learned positions "
                  "---> HINT: use --seq {} or less",
                  setup.seq_len, setup.model.name, setup.model.max_seq_len,
                  setup.model.max_seq_len);
  }
  if (setup.cluster.peak_flops(setup.precision) <= 0) {
    LATTICE_THROW(ConfigError,
                  "cluster '{}' has no peak FLOP/s for {} ---> HINT: add "
                  "device.peak_flops.{} to its profile",
                  setup.cluster.name, precision_name(setup.precision),
                  precision_name(setup.precision));
  }
}

}  // namespace lattice::plan
