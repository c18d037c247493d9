// Pipeline schedules as data (Megatron's schedule table, STYLE.md "Schedules are data"): a pure
// function of (kind, p, m, v) returns, per pipeline rank, the list of instructions that rank runs
// in one training step. A separate runtime executes the list; here it is only built, checked and
// simulated with unit costs, without any communication.
//
// Letters: p = pipeline stages (ranks), m = micro-batches per step, v = virtual stages (model
// chunks per rank). The model is cut into p·v chunks; chunk c of rank r holds model chunk c·p + r
// (Megatron's interleaving), so with v = 1 rank r holds model chunk r.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace lattice {

enum class ScheduleKind {
  kGpipe,            // "gpipe": all forwards, then all backwards (Huang et al. 2019)
  kOneFOneB,         // "1f1b": warm-up forwards, then one forward one backward (PipeDream-Flush)
  kInterleaved1F1B,  // "interleaved-1f1b": 1F1B over v chunks per rank (Narayanan et al. 2021)
  kZeroBubbleH1,     // "zb-h1": backward split into input and weight parts (Qi et al. 2023)
};

std::string_view schedule_kind_name(ScheduleKind kind);
// ConfigError listing the valid names when `name` is none of them ("interleaved" is taken for
// interleaved-1f1b).
ScheduleKind parse_schedule_kind(std::string_view name);

enum class Op {
  kForward,         // forward of (micro_batch, chunk)
  kBackward,        // full backward: input and weight gradients together
  kBackwardInput,   // gradient w.r.t. the chunk's input only (on the critical path)
  kBackwardWeight,  // gradient w.r.t. the chunk's weights only (deferrable)
  kSendActivation,  // forward output of (micro_batch, chunk) to peer_stage
  kRecvActivation,  // forward input of (micro_batch, chunk) from peer_stage
  kSendGrad,        // input gradient of (micro_batch, chunk) to peer_stage
  kRecvGrad,        // output gradient of (micro_batch, chunk) from peer_stage
  kReduceGrads,     // data-parallel gradient reduction, once all backwards are done
  kOptimizerStep,
};

std::string_view op_name(Op op);
bool is_compute(Op op);  // forward, backward and its two halves

// `chunk` is the rank-local chunk index (0 ≤ chunk < v); for send/recv it is the local chunk
// that produces (send) or consumes (recv) the tensor. Fields that do not apply hold -1.
struct Instruction {
  Op op = Op::kForward;
  int micro_batch = -1;
  int chunk = -1;
  int peer_stage = -1;

  friend bool operator==(const Instruction&, const Instruction&) = default;
};

// "forward(mb 3, chunk 1)", "send-activation(mb 3, chunk 0, to stage 1)", "optimizer-step".
std::string describe(const Instruction& instruction);

struct Schedule {
  ScheduleKind kind = ScheduleKind::kOneFOneB;
  int stages = 1;                                  // p
  int micro_batches = 1;                           // m
  int virtual_stages = 1;                          // v
  std::vector<std::vector<Instruction>> per_rank;  // (p) lists, run in order by each rank
};

// Pure. ConfigError (naming the numbers and the fix) unless p ≥ 1, m ≥ 1 and: interleaved-1f1b
// has v ≥ 2 and m % p == 0 (Megatron's rule); the others have v == 1.
// Receives sit right before the compute that needs them, sends right after the compute that
// produces them; each rank ends with reduce-grads then optimizer-step. The contract for a
// runtime is the order of sends and receives per peer: it may post receives earlier
// (non-blocking) but must pair them with the peer's sends in list order.
Schedule make_schedule(ScheduleKind kind, int p, int m, int v);

// The forwards alone (evaluation): per rank, micro-batch after micro-batch, its chunks in model
// order, with their receives and sends; no backward, no reduce-grads, no optimizer-step. Any
// v >= 1 (the chunks of every schedule). ConfigError unless p, m, v >= 1.
Schedule make_forward_schedule(int p, int m, int v);

// Activation slots a stage needs for `program`: the most micro-batch chunks alive at once, from
// their forward until their backward (or its weight part, which still reads the activations).
int activation_slots(const std::vector<Instruction>& program);

// Micro-batches whose forward has run and whose backward (input part) has not, at the peak of
// each rank's list, counted per (micro-batch, chunk): one unit holds the activations of 1/v of a
// stage's layers for one micro-batch. (p) values.
std::vector<int> peak_in_flight(const Schedule& schedule);

// Cost of each instruction in integer time units, per (micro-batch, chunk): with v chunks per
// rank a whole stage's forward costs v·forward. A full backward costs backward_input +
// backward_weight. Sends do not block the sender; a tensor arrives `comm` units after its send.
// Reduce-grads and optimizer-step take no time here: they follow the pipeline, not part of it.
struct CostUnits {
  int64_t forward = 1;
  int64_t backward_input = 1;
  int64_t backward_weight = 1;
  int64_t comm = 0;
  int64_t backward() const { return backward_input + backward_weight; }
};

struct TimedInstruction {
  Instruction instruction;
  int64_t start = 0;
  int64_t end = 0;
};

struct RankTimeline {
  std::vector<TimedInstruction> compute;  // the rank's compute instructions, in run order
  int64_t busy = 0;                       // sum of compute durations
  int64_t finish = 0;                     // end of the rank's last instruction
};

struct Timeline {
  std::vector<RankTimeline> ranks;  // (p)
  int64_t makespan = 0;             // the step: from 0 to the last rank's finish
  // Time rank r spends not computing within the step: makespan − busy.
  int64_t idle(int rank) const;
};

// Runs every rank's list in order: a compute starts when the rank is free and its inputs have
// arrived; a receive waits for the matching send. ValueError naming the rank and the instruction
// when a compute runs before its input exists, a receive gets another tensor than the one it
// names, or the ranks deadlock (every unfinished rank waits on a receive that never comes).
Timeline simulate(const Schedule& schedule, const CostUnits& costs = {});

// Idle time as a share of the step (idle / makespan), per rank and over all ranks.
struct BubbleFraction {
  std::vector<double> per_rank;  // (p)
  double overall = 0.0;          // Σ idle / (p · makespan)
};
BubbleFraction bubble_fraction(const Timeline& timeline);

// ValueError naming the rank and the instruction unless: every rank has (p) lists' worth of valid
// fields (micro-batch, chunk and peer in range; peers are the true neighbours of the chunk);
// every (micro-batch, chunk) of a rank has exactly one forward and exactly one backward (a full
// one, or one input part followed by one weight part); every send is matched by a receive on the
// peer in the same order; the simulation completes; each rank ends with reduce-grads then
// optimizer-step.
void validate_schedule(const Schedule& schedule);

}  // namespace lattice
