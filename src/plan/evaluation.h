// One layout judged: is it possible (divisibility, batch, schedule rules), does it fit in
// memory, and how fast is it.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "plan/layout.h"
#include "plan/memory_model.h"
#include "plan/time_model.h"
#include "plan/training_setup.h"

namespace lattice::plan {

enum class RejectReason {
  kDeviceCount,   // dp · tp · pp ≠ devices
  kDivisibility,  // tp does not divide heads / kv heads / d_ff / s (SP); p·v does not divide l
  kBatch,         // global batch not divisible by dp · micro-batch
  kSchedule,      // schedule rules (interleaving needs v > 1 and m % p == 0, ...)
  kMemory,        // the most loaded rank does not fit in the device
};
std::string_view reject_reason_name(RejectReason reason);

struct Rejection {
  RejectReason reason;
  std::string message;  // names the thing and the fix
};

struct Evaluation {
  Layout layout;
  std::optional<Rejection> rejection;
  MemoryBreakdown memory;  // filled when the layout is structurally valid
  TimeBreakdown time;      // filled when the layout is structurally valid

  bool feasible() const { return !rejection.has_value(); }
};

// The structural rules only (everything but memory).
std::optional<Rejection> check_layout(const TrainingSetup& setup, const Layout& layout);
// check_layout, then memory and time; a layout that does not fit is rejected with kMemory,
// naming the largest component and what would shrink it.
Evaluation evaluate(const TrainingSetup& setup, const Layout& layout);

}  // namespace lattice::plan
