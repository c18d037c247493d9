// Pipeline schedules as data, checked without communication: every kind over a sweep of (p, m, v)
// validates, its simulated idle time equals what the schedule's theory says under unit costs,
// and its peak in-flight micro-batches equal the paper's bound; broken lists are refused with
// the rank and instruction named.
#include "spec/pipeline_schedule.h"
#include "spec/schedule_grid.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>

#include "core/error.h"

namespace lattice {
namespace {

constexpr ScheduleKind kAllKinds[] = {ScheduleKind::kGpipe, ScheduleKind::kOneFOneB,
                                      ScheduleKind::kInterleaved1F1B, ScheduleKind::kZeroBubbleH1};

// The message of the `Error` that `body` throws; fails the test when it throws nothing.
template <typename Error, typename Body>
std::string thrown_message(Body&& body) {
  try {
    body();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an exception";
  return {};
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

Instruction fwd(int mb, int chunk = 0) {
  return {Op::kForward, mb, chunk, -1};
}
Instruction bwd(int mb, int chunk = 0) {
  return {Op::kBackward, mb, chunk, -1};
}
Instruction bwd_input(int mb) {
  return {Op::kBackwardInput, mb, 0, -1};
}
Instruction bwd_weight(int mb) {
  return {Op::kBackwardWeight, mb, 0, -1};
}
Instruction send_act(int mb, int peer, int chunk = 0) {
  return {Op::kSendActivation, mb, chunk, peer};
}
Instruction recv_act(int mb, int peer, int chunk = 0) {
  return {Op::kRecvActivation, mb, chunk, peer};
}
Instruction send_grad(int mb, int peer, int chunk = 0) {
  return {Op::kSendGrad, mb, chunk, peer};
}
Instruction recv_grad(int mb, int peer, int chunk = 0) {
  return {Op::kRecvGrad, mb, chunk, peer};
}
const Instruction kReduce{Op::kReduceGrads, -1, -1, -1};
const Instruction kStep{Op::kOptimizerStep, -1, -1, -1};

std::vector<Instruction> compute_only(const std::vector<Instruction>& list) {
  std::vector<Instruction> out;
  std::copy_if(list.begin(), list.end(), std::back_inserter(out),
               [](const Instruction& in) { return is_compute(in.op); });
  return out;
}

TEST(PipelineSchedule, NamesRoundTripAndUnknownNamesAreRefused) {
  for (ScheduleKind kind : kAllKinds)
    EXPECT_EQ(parse_schedule_kind(schedule_kind_name(kind)), kind);
  EXPECT_EQ(schedule_kind_name(ScheduleKind::kInterleaved1F1B), "interleaved-1f1b");
  EXPECT_EQ(schedule_kind_name(ScheduleKind::kZeroBubbleH1), "zb-h1");
  const std::string message = thrown_message<ConfigError>([] { parse_schedule_kind("pipedream"); });
  EXPECT_TRUE(contains(message, "'pipedream'")) << message;
  EXPECT_TRUE(contains(message, "zb-h1")) << message;
}

TEST(PipelineSchedule, InvalidCombinationsAreConfigErrors) {
  auto refused = [](ScheduleKind kind, int p, int m, int v) {
    return thrown_message<ConfigError>([&] { make_schedule(kind, p, m, v); });
  };
  EXPECT_TRUE(contains(refused(ScheduleKind::kOneFOneB, 0, 4, 1), "p=0"));
  EXPECT_TRUE(contains(refused(ScheduleKind::kGpipe, 2, 0, 1), "m=0"));
  EXPECT_TRUE(contains(refused(ScheduleKind::kInterleaved1F1B, 2, 4, 1), "v >= 2"));
  const std::string uneven = refused(ScheduleKind::kInterleaved1F1B, 4, 6, 2);
  EXPECT_TRUE(contains(uneven, "multiple of stages p=4")) << uneven;
  EXPECT_TRUE(contains(uneven, "m=4 or m=8")) << uneven;
  // Below p there is no smaller multiple: one suggestion, not "m=4 or m=4".
  const std::string few = refused(ScheduleKind::kInterleaved1F1B, 4, 3, 2);
  EXPECT_TRUE(contains(few, "HINT: use m=4")) << few;
  EXPECT_FALSE(contains(few, " or m=")) << few;
  for (ScheduleKind kind :
       {ScheduleKind::kGpipe, ScheduleKind::kOneFOneB, ScheduleKind::kZeroBubbleH1})
    EXPECT_TRUE(contains(refused(kind, 2, 4, 2), "v=2"));
}

// Evaluation's schedule: every (micro-batch, chunk) forward exactly once, no backward or update,
// and each rank's sends to a peer matched by that peer's receives in the same order.
TEST(PipelineSchedule, TheForwardScheduleRunsEachChunkOnceAndPairsItsTransfers) {
  for (const auto& [p, m, v] : {std::tuple{2, 1, 1}, std::tuple{2, 3, 2}, std::tuple{4, 2, 3}}) {
    const Schedule s = make_forward_schedule(p, m, v);
    ASSERT_EQ(int(s.per_rank.size()), p);
    // (from, to) -> the (micro-batch, model chunk) of each transfer, in list order.
    std::map<std::pair<int, int>, std::vector<std::pair<int, int>>> sent, received;
    for (int r = 0; r < p; ++r) {
      std::map<std::pair<int, int>, int> forwards;
      for (const Instruction& in : s.per_rank[size_t(r)]) {
        ASSERT_TRUE(in.op == Op::kForward || in.op == Op::kSendActivation ||
                    in.op == Op::kRecvActivation)
            << describe(in);
        const int k = in.chunk * p + r;
        if (in.op == Op::kForward) ++forwards[{in.micro_batch, in.chunk}];
        if (in.op == Op::kSendActivation) sent[{r, in.peer_stage}].push_back({in.micro_batch, k});
        if (in.op == Op::kRecvActivation) {
          received[{in.peer_stage, r}].push_back({in.micro_batch, k - 1});
        }
      }
      EXPECT_EQ(int(forwards.size()), m * v) << "rank " << r;
      for (const auto& [at, count] : forwards) EXPECT_EQ(count, 1);
    }
    EXPECT_EQ(sent, received) << "p " << p << " m " << m << " v " << v;
    // Every stage sends to the next; the last one to the first only when chunks wrap around.
    EXPECT_EQ(sent.size(), size_t(v == 1 ? p - 1 : p));
  }
  EXPECT_THROW(make_forward_schedule(2, 0, 1), ConfigError);
}

TEST(PipelineSchedule, OneFOneBListsForTwoStages) {
  const Schedule s = make_schedule(ScheduleKind::kOneFOneB, 2, 3, 1);
  ASSERT_EQ(s.per_rank.size(), 2u);
  // Rank 0: one warm-up forward, then F/B pairs, then the last backward.
  const std::vector<Instruction> rank0 = {
      fwd(0),         send_act(0, 1),  fwd(1), send_act(1, 1),  recv_grad(0, 1), bwd(0),  fwd(2),
      send_act(2, 1), recv_grad(1, 1), bwd(1), recv_grad(2, 1), bwd(2),          kReduce, kStep};
  // Rank 1 (last): no warm-up, strict alternation.
  const std::vector<Instruction> rank1 = {
      recv_act(0, 0),  fwd(0),         bwd(0), send_grad(0, 0), recv_act(1, 0),  fwd(1),  bwd(1),
      send_grad(1, 0), recv_act(2, 0), fwd(2), bwd(2),          send_grad(2, 0), kReduce, kStep};
  EXPECT_EQ(s.per_rank[0], rank0);
  EXPECT_EQ(s.per_rank[1], rank1);
}

TEST(PipelineSchedule, ZeroBubbleH1DefersTheWeightGradients) {
  const Schedule s = make_schedule(ScheduleKind::kZeroBubbleH1, 2, 2, 1);
  // Rank 1 defers the weight part of its first backward to the end (fills 1F1B's tail bubble).
  const std::vector<Instruction> rank1 = {
      recv_act(0, 0), fwd(0),          bwd_input(0),  send_grad(0, 0), recv_act(1, 0), fwd(1),
      bwd_input(1),   send_grad(1, 0), bwd_weight(0), bwd_weight(1),   kReduce,        kStep};
  EXPECT_EQ(s.per_rank[1], rank1);
  // Rank 0 has nothing to wait for after its input gradient: W follows B at once.
  const std::vector<Instruction> rank0 = {fwd(0),        fwd(1),       bwd_input(0),
                                          bwd_weight(0), bwd_input(1), bwd_weight(1)};
  EXPECT_EQ(compute_only(s.per_rank[0]), rank0);
}

TEST(PipelineSchedule, InterleavedVisitsChunksDepthFirstInGroupsOfP) {
  const Schedule s = make_schedule(ScheduleKind::kInterleaved1F1B, 2, 4, 2);
  // Rank 0 warm-up: 2(p−1) + (v−1)p = 4 forwards: micro-batches 0,1 on chunk 0, then on chunk 1.
  // Backwards run the chunks in reverse (chunk 1 first), the same groups of p micro-batches.
  const std::vector<Instruction> rank0 = {
      fwd(0, 0), fwd(1, 0), fwd(0, 1), fwd(1, 1), fwd(2, 0), bwd(0, 1), fwd(3, 0), bwd(1, 1),
      fwd(2, 1), bwd(0, 0), fwd(3, 1), bwd(1, 0), bwd(2, 1), bwd(3, 1), bwd(2, 0), bwd(3, 0)};
  EXPECT_EQ(compute_only(s.per_rank[0]), rank0);
  // Model chunk 1 (rank 1, chunk 0) sends to model chunk 2 (rank 0, chunk 1): the wrap-around.
  const auto& rank1 = s.per_rank[1];
  EXPECT_NE(std::find(rank1.begin(), rank1.end(), send_act(0, 0, 0)), rank1.end());
  EXPECT_NE(std::find(s.per_rank[0].begin(), s.per_rank[0].end(), recv_act(0, 1, 1)),
            s.per_rank[0].end());
}

TEST(PipelineSchedule, GpipeTimelineUnderUnitCosts) {
  const Timeline t = simulate(make_schedule(ScheduleKind::kGpipe, 2, 2, 1));
  ASSERT_EQ(t.ranks.size(), 2u);
  auto spans = [](const RankTimeline& rank) {
    std::vector<std::pair<int64_t, int64_t>> out;
    for (const TimedInstruction& timed : rank.compute) out.emplace_back(timed.start, timed.end);
    return out;
  };
  using Spans = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(spans(t.ranks[0]), (Spans{{0, 1}, {1, 2}, {5, 7}, {7, 9}}));
  EXPECT_EQ(spans(t.ranks[1]), (Spans{{1, 2}, {2, 3}, {3, 5}, {5, 7}}));
  EXPECT_EQ(t.makespan, 9);
  EXPECT_EQ(t.ranks[1].finish, 7);
  EXPECT_EQ(t.idle(0), 3);
  EXPECT_EQ(t.idle(1), 3);
}

// The sweep of the issue: p ∈ {1,2,4}, m ∈ {1,2,4,8,16}, v ∈ {1,2} where valid, every kind.
// Unit costs: F = 1, B = 2 (B-input = 1, W = 1), no communication cost. Per rank, in time units:
//   gpipe, 1f1b:  idle = (p−1)(F+B) = 3(p−1); step = (m+p−1)(F+B), so the bubble fraction is
//                 (p−1)/(m+p−1) of the step ((p−1)/m of the compute).
//   interleaved:  costs are per chunk (1/v of a stage), idle = (p−1)(F+B) chunk units =
//                 (p−1)(F+B)/v stage units; step = (m·v+p−1)(F+B): fraction (p−1)/(m·v+p−1).
//   zb-h1:        idle = max(p−1, 2p−1−m). For m ≥ p that is (p−1)(F+B−W) = p−1, a third of
//                 1F1B's (Qi et al. 2023). For m < p the deferred Ws cannot cover the tail: rank 0
//                 gets the first input gradient back at 2p and still owes 2m−1 units of B and W,
//                 so the step is 2p+2m−1 long.
// Peak in flight: gpipe m; 1f1b and zb-h1 min(p−r, m); interleaved min(m·v, 2(p−r−1)+(v−1)p+1)
// chunk units (Megatron's warm-up count + 1).
TEST(PipelineSchedule, SweepMatchesTheTheoryExactly) {
  int checked = 0;
  for (ScheduleKind kind : kAllKinds) {
    for (int p : {1, 2, 4}) {
      for (int m : {1, 2, 4, 8, 16}) {
        for (int v : {1, 2}) {
          const bool interleaved = kind == ScheduleKind::kInterleaved1F1B;
          if (interleaved ? (v < 2 || m % p != 0) : v != 1) continue;
          SCOPED_TRACE(::testing::Message()
                       << schedule_kind_name(kind) << " p=" << p << " m=" << m << " v=" << v);
          const Schedule s = make_schedule(kind, p, m, v);
          ASSERT_NO_THROW(validate_schedule(s));
          const Timeline t = simulate(s);
          const std::vector<int> peaks = peak_in_flight(s);
          const int64_t work = int64_t(m) * v * 3;  // (F+B) per (micro-batch, chunk)

          int64_t idle = 3 * (p - 1);
          if (kind == ScheduleKind::kZeroBubbleH1) idle = std::max(p - 1, 2 * p - 1 - m);
          EXPECT_EQ(t.makespan, work + idle);
          const BubbleFraction bubble = bubble_fraction(t);
          for (int r = 0; r < p; ++r) {
            EXPECT_EQ(t.ranks[size_t(r)].busy, work) << "rank " << r;
            EXPECT_EQ(t.idle(r), idle) << "rank " << r;
            EXPECT_DOUBLE_EQ(bubble.per_rank[size_t(r)], double(idle) / double(work + idle));

            int peak = std::min(p - r, m);
            if (kind == ScheduleKind::kGpipe) peak = m;
            if (interleaved) peak = std::min(m * v, 2 * (p - r - 1) + (v - 1) * p + 1);
            EXPECT_EQ(peaks[size_t(r)], peak) << "rank " << r;
          }
          EXPECT_DOUBLE_EQ(bubble.overall, double(idle) / double(work + idle));
          if (kind != ScheduleKind::kZeroBubbleH1 && !interleaved) {
            EXPECT_DOUBLE_EQ(bubble.overall, double(p - 1) / double(m + p - 1));
          }
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, 15 + 15 + 12 + 15);  // interleaved: 5 (p=1) + 4 (p=2) + 3 (p=4)
}

// Closed forms beyond unit costs. GPipe: the forward wave reaches the last stage after
// (p−1)(F+c), the backward wave returns after (p−1)(B+c): step = (m+p−1)(F+B) + 2(p−1)c.
// 1F1B has GPipe's step when transfers are free. ZB-H1 with m ≥ p: idle (p−1)(F+Bi−W).
TEST(PipelineSchedule, StepLengthForOtherCosts) {
  const CostUnits uneven{2, 3, 1, 0};
  for (int p : {2, 3, 4}) {
    for (int m : {4, 8, 16}) {
      SCOPED_TRACE(::testing::Message() << "p=" << p << " m=" << m);
      for (int64_t comm : {0, 1, 3}) {
        CostUnits costs = uneven;
        costs.comm = comm;
        EXPECT_EQ(simulate(make_schedule(ScheduleKind::kGpipe, p, m, 1), costs).makespan,
                  (m + p - 1) * 6 + 2 * (p - 1) * comm);
      }
      EXPECT_EQ(simulate(make_schedule(ScheduleKind::kOneFOneB, p, m, 1), uneven).makespan,
                (m + p - 1) * 6);
      const Timeline zb = simulate(make_schedule(ScheduleKind::kZeroBubbleH1, p, m, 1), uneven);
      for (int r = 0; r < p; ++r) EXPECT_EQ(zb.idle(r), (p - 1) * (2 + 3 - 1)) << "rank " << r;
    }
  }
}

TEST(PipelineSchedule, SchedulesStayValidWithTransferCosts) {
  const CostUnits costs{1, 2, 1, 2};
  for (ScheduleKind kind : kAllKinds) {
    const int v = kind == ScheduleKind::kInterleaved1F1B ? 2 : 1;
    const Timeline t = simulate(make_schedule(kind, 4, 8, v), costs);
    // Transfers can only add idle time, never reorder or lose work.
    for (const RankTimeline& rank : t.ranks) EXPECT_EQ(rank.busy, int64_t(8) * v * 4);
    EXPECT_GT(t.makespan, simulate(make_schedule(kind, 4, 8, v), CostUnits{1, 2, 1, 0}).makespan);
  }
}

// ---- the grid of `lattice explain` (schedule_grid.h) ----

TEST(ScheduleGrid, GpipeTwoStagesTwoMicroBatches) {
  const Schedule s = make_schedule(ScheduleKind::kGpipe, 2, 2, 1);
  EXPECT_EQ(render_schedule_grid(s, simulate(s)),
            "gpipe schedule (p=2 m=2 v=1), 9 time units\n"
            "rank 0 | F0 F1 .  .  .  B0 B0 B1 B1\n"
            "rank 1 | .  F0 F1 B0 B0 B1 B1 .  .\n"
            "peak in-flight micro-batches per stage: 2 2\n"
            "bubble fraction per stage: 33.3% 33.3%; overall 33.3%\n");
}

TEST(ScheduleGrid, SplitBackwardDrawsInputAndWeightParts) {
  const Schedule s = make_schedule(ScheduleKind::kZeroBubbleH1, 2, 2, 1);
  EXPECT_EQ(render_schedule_grid(s, simulate(s)),
            "zb-h1 schedule (p=2 m=2 v=1), 7 time units\n"
            "rank 0 | F0 F1 .  b0 w0 b1 w1\n"
            "rank 1 | .  F0 b0 F1 b1 w0 w1\n"
            "peak in-flight micro-batches per stage: 2 1\n"
            "bubble fraction per stage: 14.3% 14.3%; overall 14.3%\n");
}

TEST(ScheduleGrid, InterleavedCellsNameTheChunkAndWidenTogether) {
  // Cells are "F<micro-batch>.<local chunk>"; every cell is as wide as the widest label.
  const Schedule s = make_schedule(ScheduleKind::kInterleaved1F1B, 2, 2, 2);
  EXPECT_EQ(render_schedule_grid(s, simulate(s)),
            "interleaved-1f1b schedule (p=2 m=2 v=2), 15 time units\n"
            "rank 0 | F0.0 F1.0 F0.1 F1.1 .    .    B0.1 B0.1 .    B1.1 B1.1 B0.0 B0.0 B1.0 "
            "B1.0\n"
            "rank 1 | .    F0.0 F1.0 F0.1 B0.1 B0.1 F1.1 B1.1 B1.1 B0.0 B0.0 B1.0 B1.0 .    .\n"
            "peak in-flight micro-batches per stage: 4 3 (counted per chunk: 1/2 of a stage's "
            "layers each)\n"
            "bubble fraction per stage: 20.0% 20.0%; overall 20.0%\n");
}

TEST(ScheduleGrid, RefusesATimelineOfAnotherSchedule) {
  const Schedule two = make_schedule(ScheduleKind::kGpipe, 2, 2, 1);
  const Schedule four = make_schedule(ScheduleKind::kGpipe, 4, 2, 1);
  const std::string message =
      thrown_message<ValueError>([&] { render_schedule_grid(two, simulate(four)); });
  EXPECT_TRUE(contains(message, "the timeline has 4 ranks but the schedule 2")) << message;
}

// ---- broken lists are refused, naming the rank and the instruction ----

Schedule two_stage_gpipe() {
  return make_schedule(ScheduleKind::kGpipe, 2, 2, 1);
}

std::string validation_error(const Schedule& s) {
  return thrown_message<ValueError>([&] { validate_schedule(s); });
}

TEST(PipelineScheduleValidation, MissingForward) {
  Schedule s = two_stage_gpipe();
  auto& rank0 = s.per_rank[0];
  rank0.erase(std::find(rank0.begin(), rank0.end(), fwd(1)));
  const std::string message = validation_error(s);
  EXPECT_TRUE(contains(message, "rank 0 runs (mb 1, chunk 0) with 0 forward(s)")) << message;
}

TEST(PipelineScheduleValidation, DuplicateBackward) {
  Schedule s = make_schedule(ScheduleKind::kOneFOneB, 2, 2, 1);
  auto& rank1 = s.per_rank[1];
  rank1.insert(rank1.end() - 2, bwd(0));
  const std::string message = validation_error(s);
  EXPECT_TRUE(contains(message, "rank 1 runs (mb 0, chunk 0) with 1 forward(s), 2 backward(s)"))
      << message;
}

TEST(PipelineScheduleValidation, ComputeBeforeItsInput) {
  Schedule s = two_stage_gpipe();
  std::swap(s.per_rank[1][0], s.per_rank[1][1]);  // forward(mb 0) before its receive
  const std::string message = validation_error(s);
  EXPECT_TRUE(contains(message,
                       "rank 1, instruction #0 forward(mb 0, chunk 0): runs before its "
                       "input activation is received"))
      << message;
}

TEST(PipelineScheduleValidation, WeightGradientBeforeInputGradient) {
  Schedule s = make_schedule(ScheduleKind::kZeroBubbleH1, 2, 2, 1);
  auto& rank1 = s.per_rank[1];
  auto w0 = std::find(rank1.begin(), rank1.end(), bwd_weight(0));
  rank1.erase(w0);
  rank1.insert(rank1.begin() + 2, bwd_weight(0));  // right after forward(mb 0)
  const std::string message = validation_error(s);
  EXPECT_TRUE(contains(message,
                       "rank 1, instruction #2 backward-weight(mb 0, chunk 0): runs "
                       "before its backward-input"))
      << message;
}

TEST(PipelineScheduleValidation, ReceivesOutOfOrder) {
  Schedule s = two_stage_gpipe();
  auto& rank1 = s.per_rank[1];
  // recv(0) F0 recv(1) F1 … → recv(1) F0 recv(0) F1: the first receive meets mb 0's send.
  rank1[0].micro_batch = 1;
  rank1[2].micro_batch = 0;
  const std::string message = validation_error(s);
  EXPECT_TRUE(contains(message,
                       "rank 1, instruction #0 recv-activation(mb 1, chunk 0, from "
                       "stage 0): receives what stage 0 sent at its instruction #1 "
                       "send-activation(mb 0, chunk 0, to stage 1)"))
      << message;
}

TEST(PipelineScheduleValidation, Deadlock) {
  Schedule s = make_schedule(ScheduleKind::kOneFOneB, 2, 1, 1);
  // Rank 0: F0, send(0), recv-grad(0), B0 → F0, recv-grad(0), B0, send(0): each waits on the other.
  auto& rank0 = s.per_rank[0];
  ASSERT_EQ(rank0[1], send_act(0, 1));
  std::rotate(rank0.begin() + 1, rank0.begin() + 2, rank0.begin() + 4);
  const std::string message = validation_error(s);
  EXPECT_TRUE(contains(message, "deadlocks")) << message;
  EXPECT_TRUE(contains(message,
                       "rank 0 waits at instruction #1 recv-grad(mb 0, chunk 0, from "
                       "stage 1)"))
      << message;
  EXPECT_TRUE(contains(message,
                       "rank 1 waits at instruction #0 recv-activation(mb 0, chunk 0, "
                       "from stage 0)"))
      << message;
}

TEST(PipelineScheduleValidation, WrongPeer) {
  Schedule s = make_schedule(ScheduleKind::kOneFOneB, 4, 4, 1);
  s.per_rank[1][2].peer_stage = 3;  // rank 1's first send-activation goes to stage 2, not 3
  ASSERT_EQ(s.per_rank[1][2].op, Op::kSendActivation);
  const std::string message = validation_error(s);
  EXPECT_TRUE(contains(message,
                       "rank 1, instruction #2 send-activation(mb 0, chunk 0, to stage "
                       "3): model chunk 1 exchanges this tensor with stage 2"))
      << message;
}

TEST(PipelineScheduleValidation, SendNeverReceived) {
  Schedule s = two_stage_gpipe();
  auto& rank0 = s.per_rank[0];
  rank0.insert(rank0.end() - 2, send_act(1, 1));
  const std::string message = validation_error(s);
  EXPECT_TRUE(contains(message, "rank 0, instruction #")) << message;
  EXPECT_TRUE(contains(message, "send-activation(mb 1, chunk 0, to stage 1): is never received"))
      << message;
}

TEST(PipelineScheduleValidation, MustEndWithReduceThenStep) {
  Schedule s = two_stage_gpipe();
  s.per_rank[1].pop_back();
  EXPECT_TRUE(contains(validation_error(s), "rank 1 does not end with reduce-grads"));
  Schedule early = two_stage_gpipe();
  early.per_rank[0].insert(early.per_rank[0].begin(), kReduce);
  EXPECT_TRUE(contains(validation_error(early), "rank 0, instruction #0 reduce-grads"));
}

TEST(PipelineScheduleValidation, FieldsOutOfRange) {
  Schedule s = two_stage_gpipe();
  s.per_rank[0][0].micro_batch = 2;
  EXPECT_TRUE(contains(validation_error(s), "micro-batch out of range [0, 2)"));
  Schedule missing_rank = two_stage_gpipe();
  missing_rank.per_rank.pop_back();
  EXPECT_TRUE(contains(validation_error(missing_rank), "holds 1 rank lists"));
}

}  // namespace
}  // namespace lattice
