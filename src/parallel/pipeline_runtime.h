// Executes one rank's pipeline schedule (pipeline_schedule.h): compute instructions call the
// stage, transfers move activations and gradients between neighbouring stages over the pp group.
//
// Sends are non-blocking: the tensor is copied to a staging buffer owned by the runtime, posted,
// and waited for at the end of the step, so neighbours that send to each other at the same time
// (1F1B's steady state) never deadlock. Receives block: the time a rank waits in them is its
// pipeline bubble, measured per step. Reduce-grads and optimizer-step are the caller's: the
// runtime returns when the last backward is done and every send has been received.
#pragma once

#include <map>
#include <tuple>
#include <vector>

#include "comm/communicator.h"
#include "core/arena.h"
#include "spec/pipeline_schedule.h"

namespace lattice {

// What a pipeline stage does for the runtime (implemented by the trainer on its model).
class PipelineStage {
 public:
  virtual ~PipelineStage() = default;
  virtual void forward(int micro_batch, int chunk) = 0;
  virtual void backward(int micro_batch, int chunk) = 0;
  // Zero-bubble schedules: the backward in two parts, input gradients then weight gradients.
  virtual void backward_input(int micro_batch, int chunk) = 0;
  virtual void backward_weight(int micro_batch, int chunk) = 0;
  virtual const Tensor& output(int micro_batch, int chunk) = 0;      // activation to send
  virtual Tensor& input(int micro_batch, int chunk) = 0;             // where one arrives
  virtual const Tensor& input_grad(int micro_batch, int chunk) = 0;  // gradient to send
  virtual Tensor& output_grad(int micro_batch, int chunk) = 0;       // where one arrives
};

struct PipelineStepStats {
  double step_seconds = 0.0;
  double compute_seconds = 0.0;  // inside forward and backward
  double wait_seconds = 0.0;     // blocked in receives and in the final wait for sends
  // The final wait for sends alone: the part of the non-blocking sends compute did not hide
  // (lattice doctor's overlap check).
  double send_wait_seconds = 0.0;
  int transfers = 0;
  size_t bytes_sent = 0;
  // Share of the step this rank did not compute: its bubble (and transfer time).
  double bubble_fraction() const {
    return step_seconds > 0 ? 1.0 - compute_seconds / step_seconds : 0.0;
  }
};

class PipelineRuntime {
 public:
  // pp: the pipeline group, rank = stage. Staging buffers come from `arena`.
  PipelineRuntime(Communicator& pp, Arena& arena);

  PipelineStepStats run(const std::vector<Instruction>& program, PipelineStage& stage);

 private:
  Tensor& staging(int kind, const Instruction& instruction, const Tensor& like);

  Communicator& pp_;
  Arena& arena_;
  std::map<std::tuple<int, int, int>, Tensor> staging_;  // (kind, micro-batch, chunk)
};

}  // namespace lattice
