// Trainers on in-process thread ranks of any (dp, tp, pp, v, ZeRO) layout, and the global state
// (every parameter and both AdamW moments, as whole tensors) assembled from what their ranks
// hold: what the pipeline reshard and asynchronous save tests compare.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "comm/thread_world.h"
#include "parallel/device_mesh.h"
#include "train/trainer.h"

namespace lattice::testing {

struct TrainerLayout {
  int dp = 1;
  int tp = 1;
  int pp = 1;
  int v = 1;  // chunks per stage (interleaved-1f1b when > 1)
  int zero = 0;
  bool sp = false;

  bool operator==(const TrainerLayout&) const = default;
  MeshShape shape() const { return MeshShape{.pp = pp, .dp = dp, .tp = tp}; }
  int world_size() const { return pp * dp * tp; }
  std::string name() const {
    return fmt::format("dp{}_tp{}_pp{}{}_zero{}{}", dp, tp, pp, v > 1 ? fmt::format("v{}", v) : "",
                       zero, sp ? "_sp" : "");
  }
  ScheduleKind schedule() const {
    return v > 1 ? ScheduleKind::kInterleaved1F1B : ScheduleKind::kOneFOneB;
  }
  // The ParallelSetup of one rank of this layout on `mesh` (one thread per rank).
  ParallelSetup setup(DeviceMesh& mesh) const {
    return ParallelSetup{.dp = &mesh.dp(),
                         .zero = zero,
                         .bucket_bytes = 8 << 10,
                         .threads = 1,
                         .tp = &mesh.tp(),
                         .sequence_parallel = sp,
                         .pp = &mesh.pp(),
                         .embedding = mesh.embedding(),
                         .schedule = schedule(),
                         .virtual_stages = v};
  }
};

// Every global tensor ("<param>", "<param>.exp_avg", "<param>.exp_avg_sq") assembled from the
// ranks; NaN where no rank contributed.
using GlobalState = std::map<std::string, std::vector<float>>;

// This rank's part of the state: its local shards (placed with for_each_shard_run) and the
// moments of its optimizer range (and under ZeRO-3, which holds only the master weights of that
// range, the master weights of the range). A tied copy (the last stage's token table) goes to
// `tied_copies` instead, so that the test can compare it with the first stage's table.
inline void contribute(Trainer& trainer, GlobalState& state, GlobalState* tied_copies = nullptr) {
  const ParameterRegistry& registry = trainer.model().registry();
  AdamW& optimizer = trainer.optimizer();
  const int64_t begin = optimizer.shard_begin(), end = optimizer.shard_end();
  ParameterStore& store = trainer.model().parameters();
  const bool whole_master = store.master().numel() == registry.total_elements();
  for (int i = 0; i < int(registry.specs().size()); ++i) {
    const ParameterSpec& spec = registry.at(i);
    if (spec.tied_copy && tied_copies == nullptr) continue;
    GlobalState& into = spec.tied_copy ? *tied_copies : state;
    std::vector<int64_t> to_global(size_t(spec.local_shape.numel()), -1);
    for_each_shard_run(spec.shape, spec.shard, [&](int64_t g, int64_t l, int64_t n) {
      for (int64_t k = 0; k < n; ++k) to_global[size_t(l + k)] = g + k;
    });
    auto global = [&](const std::string& name) -> std::vector<float>& {
      std::vector<float>& t = into[name];
      if (t.empty()) t.assign(size_t(spec.shape.numel()), std::numeric_limits<float>::quiet_NaN());
      return t;
    };
    std::vector<float>& master = global(spec.name);
    if (whole_master) {
      const float* local = store.master(i).data<float>();
      for (size_t l = 0; l < to_global.size(); ++l) {
        if (to_global[l] >= 0) master[size_t(to_global[l])] = local[l];
      }
    }
    std::vector<float>& m = global(spec.name + ".exp_avg");
    std::vector<float>& v = global(spec.name + ".exp_avg_sq");
    const int64_t lo = std::max(begin, spec.offset);
    const int64_t hi = std::min(end, spec.offset + spec.local_shape.numel());
    for (int64_t at = lo; at < hi; ++at) {
      const int64_t g = to_global[size_t(at - spec.offset)];
      if (g < 0) continue;  // padding
      if (!whole_master) master[size_t(g)] = store.master().data<float>()[at - begin];
      m[size_t(g)] = optimizer.m().data<float>()[at - begin];
      v[size_t(g)] = optimizer.v().data<float>()[at - begin];
    }
  }
}

// The world rank of a shard file named "rank_NNNNN...".
inline int world_rank_of(const std::string& file) {
  int rank = -1;
  const std::string digits = file.substr(std::string("rank_").size(), 5);
  std::from_chars(digits.data(), digits.data() + digits.size(), rank);
  return rank;
}

// Every element of `want` held by some rank, and `got` equal to it bit for bit.
inline void expect_same_state(const GlobalState& got, const GlobalState& want,
                              const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [name, values] : want) {
    auto it = got.find(name);
    ASSERT_NE(it, got.end()) << what << ": " << name << " missing";
    ASSERT_EQ(it->second.size(), values.size()) << what << ": " << name;
    for (size_t k = 0; k < values.size(); ++k) {
      ASSERT_FALSE(std::isnan(values[k]))
          << what << ": " << name << " element " << k << " held by no rank";
    }
    EXPECT_EQ(std::memcmp(it->second.data(), values.data(), values.size() * sizeof(float)), 0)
        << what << ": " << name << " differs";
  }
}

// The tied copies (last stage) equal the token table (first stage), values and moments, bit for
// bit, where the copies were assembled at all.
inline void expect_tied_copies_equal_the_table(const GlobalState& state, const GlobalState& tied,
                                               const std::string& what) {
  for (const auto& [name, values] : tied) {
    const std::vector<float>& table = state.at(name);
    ASSERT_EQ(values.size(), table.size()) << what << ": " << name;
    for (size_t k = 0; k < values.size(); ++k) {
      if (std::isnan(values[k])) continue;  // a moment range no rank of the last stage owns
      ASSERT_EQ(std::memcmp(&values[k], &table[k], sizeof(float)), 0)
          << what << ": tied copy of " << name << " element " << k << " is " << values[k]
          << ", the first stage holds " << table[k];
    }
  }
}

}  // namespace lattice::testing
