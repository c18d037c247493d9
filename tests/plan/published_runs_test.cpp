// The planner against published large-scale runs (plan/published_runs.h, docs/planner.md
// "Published runs"): every published layout fits, each row is cited, and each row's error is
// locked to the figure docs/planner.md prints, so that any change to the cost model shows up
// here and the table is rewritten with it.
#include "plan/published_runs.h"

#include <gtest/gtest.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <string>

#include "plan/collective_cost.h"

namespace lattice::plan {
namespace {

const PublishedValidation& validation() {
  static const PublishedValidation v = validate_published(published_runs());
  return v;
}

TEST(PublishedRuns, EveryPublishedLayoutIsAcceptedAndEveryRowCitesItsTable) {
  const PublishedValidation& v = validation();
  ASSERT_EQ(v.checks.size(), 21u);
  EXPECT_EQ(v.accepted, 21);
  for (const PublishedCheck& c : v.checks) {
    EXPECT_TRUE(c.fits()) << c.run.id;
    EXPECT_NE(c.run.source.find("Table"), std::string::npos) << c.run.id;
    EXPECT_GT(c.run.step_seconds, 0.0) << c.run.id;
    if (!c.fits()) continue;
    // What the paper fixes is what the prediction used.
    const Layout& l = c.search.ranked.front().layout;
    EXPECT_EQ(l.tp, *c.run.layout.tp) << c.run.id;
    EXPECT_EQ(l.pp, *c.run.layout.pp) << c.run.id;
    EXPECT_EQ(l.dp, *c.run.layout.dp) << c.run.id;
    EXPECT_EQ(l.cp, *c.run.layout.cp) << c.run.id;
    EXPECT_EQ(l.recompute, c.run.layout.recompute.front()) << c.run.id;
  }
}

TEST(PublishedRuns, TheDerivedStepTimesFollowThePapersOwnFigures) {
  std::map<std::string, PublishedRun> runs;
  for (const PublishedRun& r : published_runs()) runs[r.id] = r;
  // Korthikanti et al. Table 5: seconds per iteration as printed.
  EXPECT_DOUBLE_EQ(runs.at("korthikanti-175b-selective-sp").step_seconds, 13.75);
  EXPECT_DOUBLE_EQ(runs.at("korthikanti-1t-full").step_seconds, 94.42);
  // Narayanan et al. eq. 3 at 1T (B 3072, s 2048, l 128, h 25600, V 51200) and 163 TFLOP/s on
  // 3072 GPUs.
  const double flops = 96.0 * 3072 * 2048 * 128 * 25600.0 * 25600.0 *
                       (1 + 2048 / (6.0 * 25600) + 51200 / (16.0 * 128 * 25600));
  EXPECT_NEAR(runs.at("narayanan-1008b").step_seconds, flops / (163e12 * 3072), 1e-9);
  // The 22B row's MFU (41.5%) and its 1.10 s agree under the PaLM convention the planner uses:
  // a check on the FLOP count both sides share.
  const PublishedCheck* k22 = nullptr;
  for (const PublishedCheck& c : validation().checks) {
    if (c.run.id == "korthikanti-22b-selective-sp") k22 = &c;
  }
  ASSERT_NE(k22, nullptr);
  const double mfu_at_published = k22->search.ranked.front().time.model_flops / (1.10 * 8 * 312e12);
  EXPECT_NEAR(mfu_at_published, 0.415, 0.005);
}

TEST(PublishedRuns, EachRowsErrorIsTheOneTheDocsPrint) {
  // (predicted − published) ÷ published, as docs/planner.md's table shows them. A change to the
  // cost model moves these: rerun `lattice plan --validate-published`, update the docs' table and
  // this list together.
  const std::map<std::string, double> documented = {
      {"narayanan-1.7b", 0.0},  // the calibration row
      {"narayanan-3.6b", -0.0095},
      {"narayanan-7.5b", -0.0041},
      {"narayanan-18.4b", -0.0183},
      {"narayanan-39.1b", 0.0354},
      {"narayanan-76.1b", -0.0304},
      {"narayanan-145.6b", 0.0030},
      {"narayanan-310.1b", -0.0056},
      {"narayanan-529.6b", 0.0134},
      {"narayanan-1008b", 0.0440},
      {"korthikanti-22b-full", -0.0326},
      {"korthikanti-22b-selective-sp", -0.0461},
      {"korthikanti-175b-full", -0.0216},
      {"korthikanti-175b-selective-sp", -0.0316},
      {"korthikanti-530b-full", 0.0061},
      {"korthikanti-530b-selective-sp", -0.0164},
      {"korthikanti-1t-full", -0.0210},
      {"korthikanti-1t-selective-sp", -0.0207},
      {"llama3-405b-8k-gpus", 0.0627},
      {"llama3-405b-16k-gpus", 0.0399},
      {"llama3-405b-128k-context", -0.0658},
  };
  for (const PublishedCheck& c : validation().checks) {
    ASSERT_TRUE(documented.contains(c.run.id)) << c.run.id;
    EXPECT_NEAR(c.error(), documented.at(c.run.id), 0.0005) << c.run.id;
  }
  EXPECT_NEAR(validation().mean_abs_error, 0.0264, 0.0005);
  EXPECT_EQ(validation().worst, "llama3-405b-128k-context");
}

TEST(PublishedRuns, SelectiveAndFullRecomputeAgreeOnTheSameModel) {
  // Korthikanti et al. measured selective + SP 22-24% faster than full recompute on every model;
  // before the selective rerun of the score sweeps and SP's backward all-gathers were priced the
  // planner saw 26-29%. Each pair's two errors now lie within 2.5 points of each other (the
  // full-recompute rows, without SP, also pay the pipeline scatter/gather's all-gather, which the
  // SP rows do not need: 530B's pair is 2.2 points apart).
  std::map<std::string, double> error;
  for (const PublishedCheck& c : validation().checks) error[c.run.id] = c.error();
  for (const char* size : {"22b", "175b", "530b", "1t"}) {
    const std::string base = std::string("korthikanti-") + size;
    EXPECT_NEAR(error.at(base + "-full"), error.at(base + "-selective-sp"), 0.025) << size;
  }
}

const PublishedRun& row(const std::vector<PublishedRun>& runs, const std::string& id) {
  const auto found =
      std::find_if(runs.begin(), runs.end(), [&](const PublishedRun& r) { return r.id == id; });
  EXPECT_NE(found, runs.end()) << id;
  return *found;
}

TEST(PublishedRuns, EachNarayananRowReducesItsGradientsAsItsScriptDid) {
  // run_table_1.sh: --DDP-impl torch for rows 1-4 (PyTorch's DDP, buckets reduced during the
  // backward), local for rows 5-10 (one all-reduce after it). Row 1 (1.7B, dp 32) shows what that
  // is worth: its all-reduce priced after the backward reads ~7% slower than hidden.
  const std::vector<PublishedRun> runs = published_runs();
  for (const char* id : {"narayanan-1.7b", "narayanan-3.6b", "narayanan-7.5b", "narayanan-18.4b"}) {
    EXPECT_EQ(row(runs, id).setup.cluster.runtime.dp_overlap, RuntimeFactors{}.dp_overlap) << id;
    EXPECT_NE(row(runs, id).setup.cluster.runtime.software.find("torch DDP"), std::string::npos);
  }
  for (const char* id : {"narayanan-39.1b", "narayanan-76.1b", "narayanan-145.6b",
                         "narayanan-310.1b", "narayanan-529.6b", "narayanan-1008b"}) {
    EXPECT_EQ(row(runs, id).setup.cluster.runtime.dp_overlap, 0.0) << id;
    EXPECT_NE(row(runs, id).setup.cluster.runtime.software.find("local DDP"), std::string::npos);
  }
  PublishedRun after_the_backward = row(runs, "narayanan-1.7b");
  after_the_backward.setup.cluster.runtime.dp_overlap = 0;
  EXPECT_GT(validate_published({after_the_backward}).checks[0].error(), 0.06);
}

TEST(PublishedRuns, The2021EfficiencyIsMeasuredOnRowOneAndPredictsTheOtherNine) {
  // One share of the GEMM curve for the 2021 codebase, measured on row 1 (tp 1, pp 1, its
  // reduction hidden: the step is one GPU's compute), left out of the error, and used for the
  // other nine rows. Korthikanti et al.'s 2022 code and Llama 3 keep the whole curve.
  const std::vector<PublishedRun> runs = published_runs();
  const PublishedValidation& v = validation();
  EXPECT_EQ(v.judged, 20);
  const double efficiency = row(runs, "narayanan-1.7b").setup.cluster.runtime.compute_efficiency;
  EXPECT_GT(efficiency, 0.8);
  EXPECT_LT(efficiency, 0.95);
  for (const PublishedRun& r : runs) {
    const bool narayanan = r.id.starts_with("narayanan-");
    EXPECT_EQ(r.calibration, r.id == "narayanan-1.7b") << r.id;
    EXPECT_EQ(r.setup.cluster.runtime.compute_efficiency, narayanan ? efficiency : 1.0) << r.id;
    EXPECT_EQ(r.setup.cluster.runtime.compute_efficiency_from, narayanan ? "narayanan-1.7b" : "")
        << r.id;
  }
  EXPECT_NEAR(v.checks.front().error(), 0.0, 1e-6);
  // Not a quirk of one row: rows 2 and 3 (tp 2 and 4, also nearly all compute) measure the same
  // share within 1.5%.
  for (const char* id : {"narayanan-3.6b", "narayanan-7.5b"}) {
    EXPECT_NEAR(software_efficiency_of(row(runs, id)), efficiency, 0.015 * efficiency) << id;
  }
  // Without it (the 2022 curve for 2021 code) the nine rows read 4.6-10.9% fast: the worst row
  // of the table would be beyond 10%.
  std::vector<PublishedRun> whole_curve;
  for (PublishedRun r : runs) {
    if (!r.id.starts_with("narayanan-") || r.calibration) continue;
    r.setup.cluster.runtime.compute_efficiency = 1.0;
    whole_curve.push_back(std::move(r));
  }
  const PublishedValidation uncalibrated = validate_published(whole_curve);
  EXPECT_GT(uncalibrated.max_abs_error, 0.10);
  EXPECT_EQ(uncalibrated.worst, "narayanan-76.1b");
}

TEST(PublishedRuns, ThePublishedLayoutsRankInTheFreeSearchsTopFive) {
  // The search restricted to the features each run had (its recompute, SP, schedules, ZeRO
  // stages, micro-batch and v where published) but free in tp, pp and dp: the published
  // (tp, pp, dp) is among the five best (a shape counted once however many v or micro-batches it
  // has) for every row. (Before the rows took their published micro-batch and v, Narayanan et
  // al.'s 18.4B and 39.1B rows were not.)
  std::vector<std::string> outside;
  for (PublishedRun run : published_runs()) {
    const std::array<int64_t, 3> published = {*run.layout.tp, *run.layout.pp, *run.layout.dp};
    run.layout.tp.reset(), run.layout.pp.reset(), run.layout.dp.reset();
    run.layout.top_k = 200;
    const SearchResult result = search_layouts(run.setup, run.layout);
    std::vector<std::array<int64_t, 3>> shapes;
    for (const Evaluation& e : result.ranked) {
      const std::array<int64_t, 3> shape = {e.layout.tp, e.layout.pp, e.layout.dp};
      if (std::find(shapes.begin(), shapes.end(), shape) == shapes.end()) shapes.push_back(shape);
      if (shapes.size() == 5) break;
    }
    if (std::find(shapes.begin(), shapes.end(), published) == shapes.end())
      outside.push_back(run.id);
  }
  EXPECT_EQ(fmt::format("{}", fmt::join(outside, ", ")), "");
}

}  // namespace
}  // namespace lattice::plan
