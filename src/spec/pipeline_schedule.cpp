#include "spec/pipeline_schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <deque>

#include "core/error.h"

namespace lattice {

namespace {

constexpr std::array<std::pair<ScheduleKind, std::string_view>, 4> kScheduleNames = {{
    {ScheduleKind::kGpipe, "gpipe"},
    {ScheduleKind::kOneFOneB, "1f1b"},
    {ScheduleKind::kInterleaved1F1B, "interleaved-1f1b"},
    {ScheduleKind::kZeroBubbleH1, "zb-h1"},
}};

Instruction compute(Op op, int micro_batch, int chunk) {
  return {op, micro_batch, chunk, -1};
}

// ---- compute order per kind (communication is added afterwards, the same way for all) ----

std::vector<Instruction> gpipe_order(int m) {
  std::vector<Instruction> order;
  for (int mb = 0; mb < m; ++mb) order.push_back(compute(Op::kForward, mb, 0));
  for (int mb = 0; mb < m; ++mb) order.push_back(compute(Op::kBackward, mb, 0));
  return order;
}

// PipeDream-Flush: rank r runs min(p − r − 1, m) warm-up forwards, so at most min(p − r, m)
// micro-batches are in flight, then alternates forward and backward, then drains.
std::vector<Instruction> one_f_one_b_order(int rank, int p, int m) {
  const int warmup = std::min(p - rank - 1, m);
  std::vector<Instruction> order;
  for (int mb = 0; mb < warmup; ++mb) order.push_back(compute(Op::kForward, mb, 0));
  for (int i = 0; i < m - warmup; ++i) {
    order.push_back(compute(Op::kForward, warmup + i, 0));
    order.push_back(compute(Op::kBackward, i, 0));
  }
  for (int mb = m - warmup; mb < m; ++mb) order.push_back(compute(Op::kBackward, mb, 0));
  return order;
}

// Narayanan et al. 2021 as in Megatron-LM's forward_backward_pipelining_with_interleaving: the
// k-th forward of a rank works through groups of p micro-batches, all chunks of a group before
// the next group (depth-first); backwards visit the chunks in reverse. Warm-up is
// 2(p − r − 1) + (v − 1)p forwards (capped at m·v). Megatron runs everything as warm-up when
// m == p; the general rule is used here for every m (it is valid there too and holds fewer
// activations on the later ranks).
std::vector<Instruction> interleaved_order(int rank, int p, int m, int v) {
  const int total = m * v;
  const int warmup = std::min(2 * (p - rank - 1) + (v - 1) * p, total);
  auto micro_batch_of = [&](int k) { return (k / (p * v)) * p + k % p; };
  auto forward = [&](int k) { return compute(Op::kForward, micro_batch_of(k), (k % (p * v)) / p); };
  auto backward = [&](int k) {
    return compute(Op::kBackward, micro_batch_of(k), v - 1 - (k % (p * v)) / p);
  };
  std::vector<Instruction> order;
  for (int k = 0; k < warmup; ++k) order.push_back(forward(k));
  for (int i = 0; i < total - warmup; ++i) {
    order.push_back(forward(warmup + i));
    order.push_back(backward(i));
  }
  for (int k = total - warmup; k < total; ++k) order.push_back(backward(k));
  return order;
}

// Qi et al. 2023, ZB-H1 (as in their DeepSpeed schedule): 1F1B's warm-up and in-flight bound,
// with each backward split into B (input gradient) and W (weight gradient). Rank r defers the W
// of its first min(r, m − warm-up) backwards: B goes on to the previous stage at once, and
// the deferred Ws fill the tail that 1F1B leaves idle. Ws run oldest first.
std::vector<Instruction> zero_bubble_h1_order(int rank, int p, int m) {
  std::vector<Instruction> order;
  int forwards = 0, backwards = 0, weights = 0;
  auto forward = [&] { order.push_back(compute(Op::kForward, forwards++, 0)); };
  auto backward_input = [&] { order.push_back(compute(Op::kBackwardInput, backwards++, 0)); };
  auto backward_weight = [&] { order.push_back(compute(Op::kBackwardWeight, weights++, 0)); };

  for (int i = 0; i < p - rank - 1 && forwards < m; ++i) forward();
  for (int i = 0; i < rank && forwards < m; ++i) {  // W deferred
    forward();
    backward_input();
  }
  while (forwards < m) {
    forward();
    backward_input();
    backward_weight();
  }
  while (backwards < m) {
    backward_input();
    backward_weight();
  }
  while (weights < m) backward_weight();
  return order;
}

// Adds the point-to-point transfers around rank `rank`'s compute order: a receive right before
// the compute that needs a tensor from another rank, a send right after the compute that makes
// one. Model chunk k = chunk·p + rank; its forward input comes from model chunk k − 1 and its
// output gradient from k + 1.
std::vector<Instruction> with_communication(const std::vector<Instruction>& order, int rank, int p,
                                            int v) {
  const int last_chunk = p * v - 1;
  std::vector<Instruction> out;
  for (const Instruction& step : order) {
    const int k = step.chunk * p + rank;
    const int prev_stage = (k + p - 1) % p;
    const int next_stage = (k + 1) % p;
    if (step.op == Op::kForward) {
      if (k > 0 && prev_stage != rank)
        out.push_back({Op::kRecvActivation, step.micro_batch, step.chunk, prev_stage});
      out.push_back(step);
      if (k < last_chunk && next_stage != rank)
        out.push_back({Op::kSendActivation, step.micro_batch, step.chunk, next_stage});
    } else if (step.op == Op::kBackward || step.op == Op::kBackwardInput) {
      if (k < last_chunk && next_stage != rank)
        out.push_back({Op::kRecvGrad, step.micro_batch, step.chunk, next_stage});
      out.push_back(step);
      if (k > 0 && prev_stage != rank)
        out.push_back({Op::kSendGrad, step.micro_batch, step.chunk, prev_stage});
    } else {
      out.push_back(step);
    }
  }
  return out;
}

std::string schedule_label(const Schedule& s) {
  return fmt::format("{} schedule (p={} m={} v={})", schedule_kind_name(s.kind), s.stages,
                     s.micro_batches, s.virtual_stages);
}

[[noreturn]] void reject(const Schedule& s, int rank, size_t index, const std::string& what) {
  const Instruction& instruction = s.per_rank[size_t(rank)][index];
  LATTICE_THROW(ValueError, "{}: rank {}, instruction #{} {}: {}", schedule_label(s), rank, index,
                describe(instruction), what);
}

// The fields of every instruction are in range and every peer is the true neighbour of its chunk,
// so the simulation can index by them.
void check_fields(const Schedule& s) {
  const int p = s.stages, m = s.micro_batches, v = s.virtual_stages;
  if (p < 1 || m < 1 || v < 1)
    LATTICE_THROW(ValueError, "{}: stages, micro-batches and virtual stages must be >= 1",
                  schedule_label(s));
  if (s.per_rank.size() != size_t(p))
    LATTICE_THROW(ValueError, "{}: holds {} rank lists, expected one per stage ({})",
                  schedule_label(s), s.per_rank.size(), p);
  const int last_chunk = p * v - 1;
  for (int r = 0; r < p; ++r) {
    const auto& list = s.per_rank[size_t(r)];
    for (size_t i = 0; i < list.size(); ++i) {
      const Instruction& in = list[i];
      if (in.op == Op::kReduceGrads || in.op == Op::kOptimizerStep) continue;
      if (in.micro_batch < 0 || in.micro_batch >= m)
        reject(s, r, i, fmt::format("micro-batch out of range [0, {})", m));
      if (in.chunk < 0 || in.chunk >= v)
        reject(s, r, i, fmt::format("chunk out of range [0, {})", v));
      if (is_compute(in.op)) continue;
      const int k = in.chunk * p + r;
      const bool downstream = in.op == Op::kSendActivation || in.op == Op::kRecvGrad;
      if (downstream ? k == last_chunk : k == 0)
        reject(s, r, i,
               "the model's " + std::string(downstream ? "last" : "first") +
                   " chunk has no peer in that direction");
      const int expected_peer = downstream ? (k + 1) % p : (k + p - 1) % p;
      if (in.peer_stage != expected_peer)
        reject(s, r, i,
               fmt::format("model chunk {} exchanges this tensor with stage {}", k, expected_peer));
    }
  }
}

// What one rank has done so far, per (micro-batch, local chunk).
struct RankProgress {
  RankProgress(int m, int v)
      : chunks_per_rank(v),
        forward(size_t(m * v)),
        input_grad(size_t(m * v)),
        weight_grad(size_t(m * v)),
        full_backward(size_t(m * v)),
        activation_in(size_t(m * v)),
        grad_in(size_t(m * v)) {}
  size_t at(int mb, int chunk) const { return size_t(mb * chunks_per_rank + chunk); }
  int chunks_per_rank;
  std::vector<char> forward, input_grad, weight_grad, full_backward, activation_in, grad_in;
};

struct Message {
  int micro_batch;
  int model_chunk;
  int64_t ready;
  int sender;
  size_t sender_index;
};

}  // namespace

std::string_view schedule_kind_name(ScheduleKind kind) {
  for (const auto& [k, name] : kScheduleNames)
    if (k == kind) return name;
  LATTICE_CHECK(false, "unknown ScheduleKind {}", int(kind));
}

ScheduleKind parse_schedule_kind(std::string_view name) {
  for (const auto& [kind, known] : kScheduleNames)
    if (known == name) return kind;
  // The planner's earlier spelling, still accepted (`lattice plan --schedule interleaved`).
  if (name == "interleaved") return ScheduleKind::kInterleaved1F1B;
  LATTICE_THROW(ConfigError,
                "unknown pipeline schedule '{}' ---> HINT: use one of gpipe, 1f1b, "
                "interleaved-1f1b, zb-h1",
                name);
}

std::string_view op_name(Op op) {
  switch (op) {
    case Op::kForward:
      return "forward";
    case Op::kBackward:
      return "backward";
    case Op::kBackwardInput:
      return "backward-input";
    case Op::kBackwardWeight:
      return "backward-weight";
    case Op::kSendActivation:
      return "send-activation";
    case Op::kRecvActivation:
      return "recv-activation";
    case Op::kSendGrad:
      return "send-grad";
    case Op::kRecvGrad:
      return "recv-grad";
    case Op::kReduceGrads:
      return "reduce-grads";
    case Op::kOptimizerStep:
      return "optimizer-step";
  }
  LATTICE_CHECK(false, "unknown Op {}", int(op));
}

bool is_compute(Op op) {
  return op == Op::kForward || op == Op::kBackward || op == Op::kBackwardInput ||
         op == Op::kBackwardWeight;
}

std::string describe(const Instruction& in) {
  if (in.op == Op::kReduceGrads || in.op == Op::kOptimizerStep) return std::string(op_name(in.op));
  if (is_compute(in.op))
    return fmt::format("{}(mb {}, chunk {})", op_name(in.op), in.micro_batch, in.chunk);
  const bool sends = in.op == Op::kSendActivation || in.op == Op::kSendGrad;
  return fmt::format("{}(mb {}, chunk {}, {} stage {})", op_name(in.op), in.micro_batch, in.chunk,
                     sends ? "to" : "from", in.peer_stage);
}

Schedule make_schedule(ScheduleKind kind, int p, int m, int v) {
  const std::string_view name = schedule_kind_name(kind);
  if (p < 1 || m < 1)
    LATTICE_THROW(ConfigError, "{} schedule: stages p={} and micro-batches m={} must both be >= 1",
                  name, p, m);
  if (kind == ScheduleKind::kInterleaved1F1B) {
    if (v < 2)
      LATTICE_THROW(ConfigError,
                    "interleaved-1f1b needs virtual stages v >= 2, got v={} ---> HINT: pass "
                    "--virtual-stages 2 or more, or use the 1f1b schedule",
                    v);
    if (m % p != 0) {
      // The multiples of p next to m: below it (when there is one) and above it.
      const int below = m / p * p, above = (m / p + 1) * p;
      LATTICE_THROW(
          ConfigError,
          "interleaved-1f1b needs micro-batches m={} to be a multiple of stages p={} "
          "(Megatron's rule) ---> HINT: use {}",
          m, p,
          below >= p ? fmt::format("m={} or m={}", below, above) : fmt::format("m={}", above));
    }
  } else if (v != 1) {
    LATTICE_THROW(ConfigError,
                  "{} schedule runs one model chunk per stage, got virtual stages v={} ---> "
                  "HINT: use v=1, or the interleaved-1f1b schedule for v >= 2",
                  name, v);
  }

  Schedule schedule{kind, p, m, v, {}};
  for (int r = 0; r < p; ++r) {
    std::vector<Instruction> order;
    switch (kind) {
      case ScheduleKind::kGpipe:
        order = gpipe_order(m);
        break;
      case ScheduleKind::kOneFOneB:
        order = one_f_one_b_order(r, p, m);
        break;
      case ScheduleKind::kInterleaved1F1B:
        order = interleaved_order(r, p, m, v);
        break;
      case ScheduleKind::kZeroBubbleH1:
        order = zero_bubble_h1_order(r, p, m);
        break;
    }
    std::vector<Instruction> program = with_communication(order, r, p, v);
    program.push_back({Op::kReduceGrads, -1, -1, -1});
    program.push_back({Op::kOptimizerStep, -1, -1, -1});
    schedule.per_rank.push_back(std::move(program));
  }
  return schedule;
}

Schedule make_forward_schedule(int p, int m, int v) {
  if (p < 1 || m < 1 || v < 1) {
    LATTICE_THROW(ConfigError,
                  "forward schedule: stages p={}, micro-batches m={} and virtual stages v={} "
                  "must all be >= 1",
                  p, m, v);
  }
  // GPipe's forward half: the kind only labels the lists (no kind of its own, so that no
  // training run can name a schedule without backwards).
  Schedule schedule{ScheduleKind::kGpipe, p, m, v, {}};
  for (int r = 0; r < p; ++r) {
    std::vector<Instruction> order;
    for (int mb = 0; mb < m; ++mb) {
      for (int chunk = 0; chunk < v; ++chunk) order.push_back(compute(Op::kForward, mb, chunk));
    }
    schedule.per_rank.push_back(with_communication(order, r, p, v));
  }
  return schedule;
}

int activation_slots(const std::vector<Instruction>& program) {
  int live = 0, peak = 0;
  for (const Instruction& in : program) {
    if (in.op == Op::kForward) peak = std::max(peak, ++live);
    if (in.op == Op::kBackward || in.op == Op::kBackwardWeight) --live;
  }
  return std::max(peak, 1);
}

std::vector<int> peak_in_flight(const Schedule& schedule) {
  std::vector<int> peaks;
  for (const auto& list : schedule.per_rank) {
    int in_flight = 0, peak = 0;
    for (const Instruction& in : list) {
      if (in.op == Op::kForward) peak = std::max(peak, ++in_flight);
      if (in.op == Op::kBackward || in.op == Op::kBackwardInput) --in_flight;
    }
    peaks.push_back(peak);
  }
  return peaks;
}

int64_t Timeline::idle(int rank) const {
  return makespan - ranks.at(size_t(rank)).busy;
}

Timeline simulate(const Schedule& s, const CostUnits& costs) {
  check_fields(s);
  const int p = s.stages, m = s.micro_batches, v = s.virtual_stages;
  const int last_chunk = p * v - 1;

  // One FIFO per (sender, receiver, tensor kind): sends and receives pair up in order.
  std::vector<std::deque<Message>> channels(size_t(p * p * 2));
  auto channel = [&](int from, int to, bool grad) -> std::deque<Message>& {
    return channels[size_t((from * p + to) * 2 + (grad ? 1 : 0))];
  };
  std::vector<RankProgress> progress(size_t(p), RankProgress(m, v));
  std::vector<size_t> next(size_t(p), 0);
  std::vector<int64_t> clock(size_t(p), 0);
  Timeline timeline;
  timeline.ranks.resize(size_t(p));

  // Runs rank r's next instruction; false when it must wait for a message not yet sent.
  auto step = [&](int r) -> bool {
    const size_t i = next[size_t(r)];
    const Instruction& in = s.per_rank[size_t(r)][i];
    RankProgress& done = progress[size_t(r)];
    int64_t& now = clock[size_t(r)];
    if (in.op == Op::kReduceGrads || in.op == Op::kOptimizerStep) {
      ++next[size_t(r)];
      return true;
    }
    const size_t at = done.at(in.micro_batch, in.chunk);
    const int k = in.chunk * p + r;
    // Whether the tensor that (micro-batch, model chunk `from`) hands to rank r already exists
    // there: received from another rank, or made earlier on this rank.
    auto input_ready = [&](int from, bool grad) {
      const int owner = from % p;
      if (owner != r) return (grad ? done.grad_in : done.activation_in)[at] != 0;
      const size_t there = done.at(in.micro_batch, from / p);
      return grad ? (done.input_grad[there] || done.full_backward[there])
                  : done.forward[there] != 0;
    };
    auto run = [&](int64_t cost) {
      timeline.ranks[size_t(r)].compute.push_back({in, now, now + cost});
      timeline.ranks[size_t(r)].busy += cost;
      now += cost;
    };

    switch (in.op) {
      case Op::kForward:
        if (done.forward[at]) reject(s, r, i, "runs a second time");
        if (k > 0 && !input_ready(k - 1, false))
          reject(s, r, i, "runs before its input activation is received");
        done.forward[at] = 1;
        run(costs.forward);
        break;
      case Op::kBackward:
      case Op::kBackwardInput:
        if (done.full_backward[at] || done.input_grad[at])
          reject(s, r, i, "the input gradient of this micro-batch is computed a second time");
        if (!done.forward[at]) reject(s, r, i, "runs before the forward it differentiates");
        if (k < last_chunk && !input_ready(k + 1, true))
          reject(s, r, i, "runs before its output gradient is received");
        (in.op == Op::kBackward ? done.full_backward : done.input_grad)[at] = 1;
        run(in.op == Op::kBackward ? costs.backward() : costs.backward_input);
        break;
      case Op::kBackwardWeight:
        if (done.full_backward[at] || done.weight_grad[at])
          reject(s, r, i, "the weight gradient of this micro-batch is computed a second time");
        if (!done.input_grad[at]) reject(s, r, i, "runs before its backward-input");
        done.weight_grad[at] = 1;
        run(costs.backward_weight);
        break;
      case Op::kSendActivation:
      case Op::kSendGrad: {
        const bool grad = in.op == Op::kSendGrad;
        const bool made = grad ? (done.input_grad[at] || done.full_backward[at]) : done.forward[at];
        if (!made) reject(s, r, i, "sends a tensor this rank has not computed yet");
        channel(r, in.peer_stage, grad).push_back({in.micro_batch, k, now + costs.comm, r, i});
        break;
      }
      case Op::kRecvActivation:
      case Op::kRecvGrad: {
        const bool grad = in.op == Op::kRecvGrad;
        auto& queue = channel(in.peer_stage, r, grad);
        if (queue.empty()) return false;
        const Message message = queue.front();
        const int expected_chunk = grad ? k + 1 : k - 1;
        if (message.micro_batch != in.micro_batch || message.model_chunk != expected_chunk)
          reject(s, r, i,
                 fmt::format("receives what stage {} sent at its instruction #{} {} (sends and "
                             "receives must pair up in the same order)",
                             message.sender, message.sender_index,
                             describe(s.per_rank[size_t(message.sender)][message.sender_index])));
        queue.pop_front();
        (grad ? done.grad_in : done.activation_in)[at] = 1;
        now = std::max(now, message.ready);
        break;
      }
      case Op::kReduceGrads:
      case Op::kOptimizerStep:
        break;
    }
    ++next[size_t(r)];
    return true;
  };

  // Ranks run independently until they wait on a receive; sends never block, so the timing does
  // not depend on the order ranks are stepped in.
  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < p; ++r)
      while (next[size_t(r)] < s.per_rank[size_t(r)].size() && step(r)) moved = true;
  }
  std::string stuck;
  for (int r = 0; r < p; ++r) {
    const size_t i = next[size_t(r)];
    if (i < s.per_rank[size_t(r)].size())
      stuck += fmt::format("; rank {} waits at instruction #{} {}", r, i,
                           describe(s.per_rank[size_t(r)][i]));
  }
  if (!stuck.empty())
    LATTICE_THROW(ValueError,
                  "{} deadlocks{} ---> HINT: a receive needs the matching send "
                  "earlier in the peer's list",
                  schedule_label(s), stuck);
  for (const auto& queue : channels)
    if (!queue.empty())
      reject(s, queue.front().sender, queue.front().sender_index, "is never received by its peer");

  for (int r = 0; r < p; ++r) {
    timeline.ranks[size_t(r)].finish = clock[size_t(r)];
    timeline.makespan = std::max(timeline.makespan, clock[size_t(r)]);
  }
  return timeline;
}

BubbleFraction bubble_fraction(const Timeline& timeline) {
  BubbleFraction fraction;
  const auto ranks = int(timeline.ranks.size());
  if (ranks == 0 || timeline.makespan == 0) {
    fraction.per_rank.assign(size_t(ranks), 0.0);
    return fraction;
  }
  int64_t idle_total = 0;
  for (int r = 0; r < ranks; ++r) {
    fraction.per_rank.push_back(double(timeline.idle(r)) / double(timeline.makespan));
    idle_total += timeline.idle(r);
  }
  fraction.overall = double(idle_total) / (double(ranks) * double(timeline.makespan));
  return fraction;
}

void validate_schedule(const Schedule& s) {
  check_fields(s);
  const int m = s.micro_batches, v = s.virtual_stages;
  for (int r = 0; r < s.stages; ++r) {
    const auto& list = s.per_rank[size_t(r)];
    if (list.size() < 2 || list[list.size() - 2].op != Op::kReduceGrads ||
        list.back().op != Op::kOptimizerStep)
      LATTICE_THROW(ValueError, "{}: rank {} does not end with reduce-grads, optimizer-step",
                    schedule_label(s), r);
    // Counts per (micro-batch, chunk): forwards, full backwards, input parts, weight parts.
    std::vector<std::array<int, 4>> counts(size_t(m * v), {0, 0, 0, 0});
    for (size_t i = 0; i < list.size(); ++i) {
      const Instruction& in = list[i];
      const bool tail_reduce = i + 2 == list.size() && in.op == Op::kReduceGrads;
      const bool tail_step = i + 1 == list.size() && in.op == Op::kOptimizerStep;
      if ((in.op == Op::kReduceGrads && !tail_reduce) ||
          (in.op == Op::kOptimizerStep && !tail_step))
        reject(s, r, i, "reduce-grads and optimizer-step must be the last two instructions");
      if (!is_compute(in.op)) continue;
      const int slot = in.op == Op::kForward         ? 0
                       : in.op == Op::kBackward      ? 1
                       : in.op == Op::kBackwardInput ? 2
                                                     : 3;
      ++counts[size_t(in.micro_batch * v + in.chunk)][size_t(slot)];
    }
    for (int mb = 0; mb < m; ++mb) {
      for (int c = 0; c < v; ++c) {
        const auto& [forwards, full, inputs, weights] = counts[size_t(mb * v + c)];
        const bool one_backward = (full == 1 && inputs == 0 && weights == 0) ||
                                  (full == 0 && inputs == 1 && weights == 1);
        if (forwards != 1 || !one_backward)
          LATTICE_THROW(ValueError,
                        "{}: rank {} runs (mb {}, chunk {}) with {} forward(s), {} backward(s), "
                        "{} backward-input(s) and {} backward-weight(s); expected exactly one "
                        "forward and one backward (full, or input then weight)",
                        schedule_label(s), r, mb, c, forwards, full, inputs, weights);
      }
    }
  }
  simulate(s);  // dependencies, send/receive pairing and deadlock
}

}  // namespace lattice
