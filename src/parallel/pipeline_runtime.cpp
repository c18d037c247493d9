#include "parallel/pipeline_runtime.h"

#include <algorithm>

#include "core/error.h"
#include "core/timer.h"
#include "trace/event_recorder.h"

namespace lattice {

namespace {

// Activations and gradients travel under different tags: with interleaving the first and last
// stage exchange both kinds, and each kind must pair sends with receives in list order.
constexpr uint32_t kActivationTag = 0x51;
constexpr uint32_t kGradientTag = 0x52;

}  // namespace

PipelineRuntime::PipelineRuntime(Communicator& pp, Arena& arena) : pp_(pp), arena_(arena) {}

Tensor& PipelineRuntime::staging(int kind, const Instruction& in, const Tensor& like) {
  Tensor& buffer = staging_[{kind, in.micro_batch, in.chunk}];
  if (!buffer.defined() || buffer.shape() != like.shape() || buffer.dtype() != like.dtype()) {
    buffer = Tensor::empty(arena_, like.shape(), like.dtype(), MemoryCategory::kCommunication);
  }
  return buffer;
}

PipelineStepStats PipelineRuntime::run(const std::vector<Instruction>& program,
                                       PipelineStage& stage) {
  PipelineStepStats stats;
  Stopwatch step;
  std::vector<Communicator::SendHandle> sends;
  EventRecorder* recorder = current_event_recorder();  // null: no trace
  // Runs fn, adds its time to `total` and records it as one trace event of the instruction.
  auto timed = [&](double& total, TraceCategory category, const Instruction& in, auto&& fn) {
    Stopwatch watch;
    TraceScope scope(recorder, op_name(in.op), category,
                     {{"micro_batch", in.micro_batch}, {"chunk", in.chunk}});
    fn();
    total += watch.seconds();
  };
  for (const Instruction& in : program) {
    switch (in.op) {
      case Op::kForward:
        timed(stats.compute_seconds, TraceCategory::kCompute, in,
              [&] { stage.forward(in.micro_batch, in.chunk); });
        break;
      case Op::kBackward:
        timed(stats.compute_seconds, TraceCategory::kCompute, in,
              [&] { stage.backward(in.micro_batch, in.chunk); });
        break;
      case Op::kBackwardInput:
        timed(stats.compute_seconds, TraceCategory::kCompute, in,
              [&] { stage.backward_input(in.micro_batch, in.chunk); });
        break;
      case Op::kBackwardWeight:
        timed(stats.compute_seconds, TraceCategory::kCompute, in,
              [&] { stage.backward_weight(in.micro_batch, in.chunk); });
        break;
      case Op::kSendActivation:
      case Op::kSendGrad: {
        const bool activation = in.op == Op::kSendActivation;
        const Tensor& source = activation ? stage.output(in.micro_batch, in.chunk)
                                          : stage.input_grad(in.micro_batch, in.chunk);
        Tensor& buffer = staging(activation ? 0 : 1, in, source);
        buffer.copy_from(source);
        if (recorder != nullptr) {
          const int64_t now = recorder->now_ns();
          recorder->record(
              op_name(in.op), TraceCategory::kSend, now, now,
              {{"micro_batch", in.micro_batch}, {"chunk", in.chunk}, {"bytes", buffer.nbytes()}});
        }
        sends.push_back(pp_.send_async(buffer, in.peer_stage,
                                       {.tag = activation ? kActivationTag : kGradientTag}));
        ++stats.transfers;
        stats.bytes_sent += buffer.nbytes();
        break;
      }
      case Op::kRecvActivation:
      case Op::kRecvGrad: {
        const bool activation = in.op == Op::kRecvActivation;
        Tensor& target = activation ? stage.input(in.micro_batch, in.chunk)
                                    : stage.output_grad(in.micro_batch, in.chunk);
        // A receive is the stage waiting on its neighbour: the pipeline bubble.
        timed(stats.wait_seconds, TraceCategory::kIdle, in, [&] {
          pp_.recv(target, in.peer_stage, {.tag = activation ? kActivationTag : kGradientTag});
        });
        ++stats.transfers;
        break;
      }
      case Op::kReduceGrads:
      case Op::kOptimizerStep:
        break;  // the caller's, after the pipeline has drained
    }
  }
  {
    Stopwatch watch;
    TraceScope scope(recorder, "wait for sends", TraceCategory::kIdle);
    for (Communicator::SendHandle& send : sends) send.wait();
    stats.send_wait_seconds = watch.seconds();
    stats.wait_seconds += stats.send_wait_seconds;
  }
  stats.step_seconds = step.seconds();
  return stats;
}

}  // namespace lattice
